#!/usr/bin/env python3
"""The ublk export under a real Linux (issues 12, 17): restart without losing IO, read-only.
Python 3.11 stdlib only; one VM boot (the harness's Debian 6.12 kernel, TCG).

    tests/vm/ublk.sh            # quick: fio verify on /dev/ublkb0, server SIGKILLed mid-run
                                # and `serve --recover` taking over; the same with the
                                # server handing the device over (`stop --keep-ublk`);
                                # a read-only export
    tests/vm/ublk.sh --full     # and the same kill, hand-over and recovery with ext4 over
                                # the device
    URAID=path/to/uraid tests/vm/ublk.sh     # default: target/debug/uraid, then release

A raid5 array of four 64 MiB images (internal bitmap) is created on the host; uraid and fio
run inside the guest. Each recovery scenario: `serve --ublk --ublk-id 0`, fio writes with
verify (crc32c, libaio QD32, direct), the server is SIGKILLed while fio still runs (checked),
the device must stay, `serve --ublk --ublk-id 0 --recover` takes it over, fio must finish
with no error and its verify pass; a second fio (`verify_only`) reads it all back through the
new server; `uraid stop` exits 0 and the device goes away. The hand-over scenario (an upgrade
or restart in place) is the same with `uraid stop --keep-ublk` in place of the SIGKILL: the
server exits 75 (the status the systemd unit restarts on), the array is clean on disk (no resync owed), the device stays and fio waits. Read-only: `serve --readonly`
gives a device the kernel marks read-only (`/sys/block/ublkbN/ro` = 1) that refuses a write
and serves reads.
Prints `PASS name` / `FAIL name` lines; exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import CACHE, MiB, Boot, Pattern, find_uraid  # noqa: E402

MEMBER_MIB = 64
NDISKS = 4

GUEST_JOB = r"""
O=/share/out/ublk
mkdir -p "$O"
M="/dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4"
U=/dev/ublkb0
FAILS=0
mark() { echo "@@ $(cut -d' ' -f1 /proc/uptime) $*" >/dev/ttyS0; echo "== $*"; }
check() {
    _n=$1; shift
    if "$@"; then echo "PASS $_n"; else echo "FAIL $_n"; FAILS=$((FAILS + 1)); fi
}
# serve TAG ARGS...: uraid serve --ublk on the four disks in the background; waits for the
# banner's ublk line. Output in /tmp/serve.TAG.{out,err}.
serve() {
    _t=$1; shift
    rm -f /tmp/ctl.sock
    uraid serve --ublk --no-nbd --name md0 --control /tmp/ctl.sock "$@" $M \
        >/tmp/serve.$_t.out 2>/tmp/serve.$_t.err &
    SPID=$!
    _i=0
    until grep -q '^ublk: ' /tmp/serve.$_t.out; do
        _i=$((_i + 1))
        if [ $_i -gt 1800 ] || ! kill -0 $SPID 2>/dev/null; then
            echo "serve $_t did not start"; cat /tmp/serve.$_t.err; return 1
        fi
        sleep 0.1
    done
    cat /tmp/serve.$_t.out
}
stop_served() {
    uraid stop --control /tmp/ctl.sock >/dev/null
    wait $SPID
}
FIO_ARGS="--name=v --rw=randwrite --bs=4k --ioengine=libaio --iodepth=32 --direct=1 \
    --verify=crc32c --verify_fatal=1 --randrepeat=1"
# writes_to DEV: writes the kernel has completed on block device DEV (/sys/block/*/stat).
writes_to() { awk '{print $5}' "/sys/block/${1#/dev/}/stat"; }
# interrupted_mid_fio NAME FILE SIZE HOW: fio with verify on FILE; while it runs the server
# is SIGKILLed (HOW=kill) or hands the device over (HOW=handover: `uraid stop --keep-ublk`,
# the array stopped clean and /dev/ublkb0 kept); `serve --recover` takes over, fio must
# finish clean; then a verify-only pass.
# fio's writes are held to 400 per second, so its write pass over SIZE in 4 KiB blocks lasts
# at least SIZE/4k/400 seconds (10 s for 16M) however fast the guest is; the interruption
# comes once 200 writes have reached the ublk device (at least 0.5 s in), so fio is mid-run
# by construction, not by a guess at the guest's speed.
interrupted_mid_fio() {
    _k=$1 _f=$2 _s=$3 _how=$4
    _w0=$(writes_to $U)
    fio $FIO_ARGS --rate_iops=400 --filename="$_f" --size="$_s" --do_verify=1 \
        --output="$O/$_k.fio" 2>"$O/$_k.fio.err" &
    _fio=$!
    _i=0
    while [ $(($(writes_to $U) - _w0)) -lt 200 ] && [ $_i -lt 1200 ] && kill -0 $_fio 2>/dev/null; do
        _i=$((_i + 1))
        sleep 0.05
    done
    check "$_k-fio-writing-at-kill" test $(($(writes_to $U) - _w0)) -ge 200
    check "$_k-fio-running-at-kill" kill -0 $_fio
    if [ "$_how" = handover ]; then
        check "$_k-stop-keep-ublk" sh -c \
            "uraid stop --keep-ublk --control /tmp/ctl.sock >$O/$_k.stop 2>&1 && grep -q 'ublkb0 kept' $O/$_k.stop"
        wait $SPID
        # 75 (EX_TEMPFAIL): the status the systemd unit restarts on (RestartForceExitStatus).
        check "$_k-server-exit75" test $? = 75
        # Handed over clean: the next server owes no resync.
        check "$_k-clean-at-handover" sh -c "uraid examine /dev/disk/1 | grep -q 'State : clean'"
        check "$_k-fio-waits" kill -0 $_fio
    else
        kill -KILL $SPID
        wait $SPID 2>/dev/null
    fi
    check "$_k-device-stays" test -b $U
    # The kill's server comes back as the systemd unit starts it (--recover=auto: the device
    # is there, so it is taken over); the hand-over's with --recover.
    if [ "$_how" = handover ]; then _rec=--recover; else _rec=--recover=auto; fi
    if serve "$_k-recover" --ublk-id 0 $_rec; then
        if [ "$_how" != handover ]; then
            check "$_k-auto-takes-over" grep -q 'is there: taking it over' "/tmp/serve.$_k-recover.err"
        fi
        wait $_fio
        check "$_k-fio-exit0" test $? = 0
        check "$_k-fio-no-error" grep -q 'err= 0' "$O/$_k.fio"
        check "$_k-verify-again" fio $FIO_ARGS --filename="$_f" --size="$_s" --verify_only \
            --output="$O/$_k.verify.fio"
    else
        check "$_k-recover" false
        kill -KILL $_fio 2>/dev/null
    fi
    cp /tmp/serve.*.err "$O/" 2>/dev/null
}
mkdir -p /mnt

mark "ublk: raw device, SIGKILL and --recover"
# --recover=auto with no device left: a first start adds it.
if serve raw --ublk-id 0 --recover=auto; then
    check raw-auto-adds grep -q 'is not there: adding it' /tmp/serve.raw.err
    interrupted_mid_fio raw $U 16M kill
    check raw-stop stop_served
    check raw-device-gone test ! -e $U
else
    check raw-serve false
fi

mark "ublk: raw device, handed over (stop --keep-ublk) and --recover"
if serve handover --ublk-id 0; then
    # The kill above left a resync owed: let it finish, so that "clean" after the hand-over
    # is the hand-over's doing.
    check handover-resynced-first uraid wait --control /tmp/ctl.sock
    interrupted_mid_fio handover $U 16M handover
    check handover-stop stop_served
    check handover-device-gone test ! -e $U
else
    check handover-serve false
fi

if [ "$MODE" = full ]; then
    mark "ublk: ext4, SIGKILL and --recover"
    if serve ext4 --ublk-id 0; then
        check ext4-mkfs mkfs.ext4 -q -F $U
        check ext4-mount mount -t ext4 $U /mnt
        if grep -q ' /mnt ' /proc/mounts; then
            interrupted_mid_fio ext4 /mnt/fio.dat 16M kill
            # The hand-over under a mounted filesystem, once the kill's resync is done.
            check ext4-resynced uraid wait --control /tmp/ctl.sock
            interrupted_mid_fio ext4-handover /mnt/fio2.dat 16M handover
            check ext4-umount umount /mnt
            check ext4-fsck fsck.ext4 -n -f $U
        fi
        check ext4-stop stop_served
        check ext4-device-gone test ! -e $U
    else
        check ext4-serve false
    fi
fi

mark "ublk: read-only"
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
if serve ro --readonly --metrics 127.0.0.1:9100; then
    R=$(grep '^ublk: ' /tmp/serve.ro.out | cut -d' ' -f2)
    check ro-kernel-read-only grep -qx 1 /sys/block/${R#/dev/}/ro
    check ro-write-refused sh -c "! dd if=/dev/zero of=$R bs=4k count=1 conv=fsync 2>$O/ro.dd"
    check ro-read-served dd if=$R of=/dev/null bs=64k count=16 iflag=direct
    # The ublk export's requests are in the metrics (uraid_ublk_*), reads counted.
    wget -qO $O/ro.metrics http://127.0.0.1:9100/metrics
    check ro-metrics-ublk-reads sh -c \
        "grep '^uraid_ublk_requests_total{.*op=\"read\"' $O/ro.metrics | awk '{ if (\$2 > 0) ok=1 } END { exit !ok }'"
    check ro-stop stop_served
else
    check ro-serve false
fi
cp /tmp/serve.*.err "$O/" 2>/dev/null
mark "ublk: done, $FAILS failed"
[ $FAILS = 0 ]
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="also the ext4 scenario")
    ap.add_argument("--uraid", help="the uraid binary (default: $URAID, target/debug/uraid)")
    ap.add_argument("--keep", action="store_true", help="keep the run folder")
    ap.add_argument("--timeout-scale", type=float, default=1.0)
    args = ap.parse_args()
    uraid = find_uraid(args.uraid or os.environ.get("URAID"))
    if uraid is None:
        print("FAIL ublk: no uraid binary (cargo build -p uraid)")
        return 3
    fio = shutil.which("fio")
    if fio is None:
        print("FAIL ublk: fio is not installed on the host (apt-get install fio)"
              if os.environ.get("CI") else "SKIP ublk: no fio on the host")
        return 1 if os.environ.get("CI") else 0
    run_dir = CACHE / "runs" / time.strftime("ublk-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    images = []
    for i in range(NDISKS):
        p = run_dir / f"m{i}.img"
        with open(p, "wb") as f:
            f.truncate(MEMBER_MIB * MiB)
        images.append(p)
    r = subprocess.run([str(uraid), "create", "-l", "5", "-n", str(NDISKS), "-N", "ublk",
                        "-b", "internal"] + [str(p) for p in images],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL ublk-create: {r.stderr}")
        return 1
    boot = Boot(run_dir, "vm", Pattern(64 * MiB))
    for p in images:
        boot.add_disk(p)
    boot.guest_bins += [uraid, Path(fio)]
    boot.job.append(f"MODE={'full' if args.full else 'quick'}\n" + GUEST_JOB)
    boot.budget_s = 1200 if args.full else 700
    t0 = time.monotonic()
    boot.boot(args.timeout_scale)
    elapsed = time.monotonic() - t0
    log_path = boot.share / "out" / "job.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    fails = 0
    for line in log.splitlines():
        if line.startswith(("PASS ", "FAIL ")):
            print(line, flush=True)
            fails += line.startswith("FAIL ")
    if not boot.finished():
        print(f"FAIL ublk-vm: {boot.vm_problem()}\n{boot.console_tail()}")
        fails += 1
    if fails or "PASS " not in log:
        print(f"--- guest log ---\n{log[-6000:]}")
        fails = max(fails, 1)
    print(f"{'failed' if fails else 'passed'} in {elapsed:.0f} s; run folder: {run_dir}")
    if not fails and not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
