#!/usr/bin/env python3
"""uraid's block exports under a real Linux (project issue 4). Python 3.11 stdlib only.

    tests/vm/export.sh                    # setup.sh, then this: one VM boot, a few minutes
    URAID=/path/to/uraid tests/vm/export.sh   # default: target/debug/uraid, then target/release
    tests/vm/export.sh --keep             # keep the run folder (images, logs) even on success

A raid5 array of four 64 MiB images is created on the host. In the VM (the harness's Debian
6.12 kernel, which has nbd and ublk_drv), uraid runs *inside the guest* on the four disks:

1. `uraid serve --nbd unix:...`, `nbd-client` to /dev/nbd0, mkfs.ext4, mount, write files,
   fstrim, umount, `fsck.ext4 -n -f` clean, disconnect, `uraid stop`; superblocks clean;
   `uraid check` finds 0 mismatches. The host sees the member images give back the blocks
   of a deleted scratch file once fstrim ran (the disks pass discards to the image files).
2. `uraid serve --ublk --no-nbd`: /dev/ublkbN, mount, the files verify; a new file is written
   while `uraid fail` takes a member out; fstrim, umount, fsck clean; SIGTERM; the device goes away;
   superblocks clean.
3. `uraid serve --nbd` again, now degraded: every file verifies, fsck clean, `uraid stop`.

Passes 1 and 2 use the default IO engine (io_uring), pass 3 `--io-engine sync`.

Then on the host: `uraid read` of the members gives an image that `e2fsck -n -f` finds clean
and whose files (read with debugfs) have the checksums the guest recorded.
Prints `PASS name` / `FAIL name` lines and `N passed, N failed`; exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import CACHE, MiB, Boot, Pattern, find_uraid  # noqa: E402

MEMBER_MIB = 64
NDISKS = 4
BOOT_BUDGET_S = 600

# The guest's job. lib.sh (the harness's helpers) is sourced before this; `set -u` is on.
GUEST_JOB = r"""
O=/share/out/export
mkdir -p "$O"
M="/dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4"
FAILS=0
mark() { echo "@@ $(cut -d' ' -f1 /proc/uptime) $*" >/dev/ttyS0; echo "== $*"; }
check() {
    _n=$1; shift
    if "$@"; then echo "PASS $_n"; else echo "FAIL $_n"; FAILS=$((FAILS + 1)); fi
}
wait_for() {
    _i=0
    while [ ! -e "$1" ]; do
        _i=$((_i + 1)); [ $_i -gt 1200 ] && return 1; sleep 0.1
    done
}
# serve ARGS...: start uraid serve in the background on the four disks, with the default IO
# engine (io_uring) unless ENGINE says otherwise.
ENGINE=
serve() {
    rm -f /tmp/ctl.sock
    # The scsi disks unmap (discard=unmap) and read zeros there, but report no LBPRZ:
    # md's devices_handle_discard_safely says so for them.
    uraid ${ENGINE:+--io-engine $ENGINE} --devices-handle-discard-safely serve "$@" --name md0 \
        --control /tmp/ctl.sock $M >/tmp/serve.out 2>/tmp/serve.err &
    SPID=$!
    wait_for /tmp/ctl.sock || { echo "serve did not start"; cat /tmp/serve.err; return 1; }
    _i=0
    until grep -q '^control:' /tmp/serve.out; do
        _i=$((_i + 1)); [ $_i -gt 100 ] && break; sleep 0.1
    done
    cat /tmp/serve.out
}
all_clean() {
    for d in $M; do
        uraid examine "$d" | grep -q 'State : clean' || { echo "$d not clean"; return 1; }
    done
}
live_clean() {
    for d in /dev/disk/1 /dev/disk/3 /dev/disk/4; do
        uraid examine "$d" | grep -q 'State : clean' || { echo "$d not clean"; return 1; }
    done
}
# on_mnt CMD...: run CMD only with a file system mounted at /mnt (never write to the rootfs).
on_mnt() { grep -q ' /mnt ' /proc/mounts && "$@"; }
nbd_up() {
    nbd-client -u /tmp/nbd.sock /dev/nbd0 -N md0 -b 4096 && wait_for /sys/block/nbd0/pid
}
mkdir -p /mnt

mark "export: nbd"
if serve --nbd unix:/tmp/nbd.sock; then
    check nbd-client-connect nbd_up
    check nbd-mkfs mkfs.ext4 -q -F /dev/nbd0
    check nbd-mount mount -t ext4 /dev/nbd0 /mnt
    if on_mnt true; then
        dd if=/dev/urandom of=/mnt/f1 bs=1M count=8 2>/dev/null
        mkdir -p /mnt/dir
        dd if=/dev/urandom of=/mnt/dir/f2 bs=64k count=37 2>/dev/null
        echo hello-uraid >/mnt/dir/small
        sha256sum /mnt/f1 /mnt/dir/f2 /mnt/dir/small >"$O/sums.nbd"
        dd if=/dev/urandom of=/mnt/scratch bs=1M count=48 2>/dev/null
        sync
        rm /mnt/scratch
        sync
        : >/share/out/export/phase-scratch  # the host measures the images now
        sleep 2
    fi
    check nbd-fstrim on_mnt fstrim -v /mnt
    sync
    : >/share/out/export/phase-trimmed
    sleep 2
    check nbd-umount umount /mnt
    check nbd-fsck fsck.ext4 -n -f /dev/nbd0
    nbd-client -d /dev/nbd0
    check nbd-stop uraid stop --control /tmp/ctl.sock
    wait $SPID
    check nbd-server-exit0 test $? = 0
    check nbd-superblocks-clean all_clean
    check nbd-check-0-mismatches sh -c "uraid check -q $M | tee /dev/stderr | grep -q 'mismatch_cnt: 0'"
else
    check nbd-serve false
fi

mark "export: ublk"
if serve --ublk --no-nbd; then
    U=$(grep '^ublk: ' /tmp/serve.out | cut -d' ' -f2)
    echo "ublk device: $U"
    check ublk-device test -b "$U"
    check ublk-mount mount -t ext4 "$U" /mnt
    check ublk-files-verify on_mnt sha256sum -c "$O/sums.nbd"
    if on_mnt true; then
        dd if=/dev/urandom of=/mnt/f3 bs=1M count=12 2>/tmp/dd3.err &
        DD=$!
        sleep 0.5
        check ublk-fail-member uraid fail --control /tmp/ctl.sock /dev/disk/2
        wait $DD
        check ublk-write-during-fail test $? = 0
        sync
        sha256sum /mnt/f3 >"$O/sums.ublk"
    fi
    check ublk-fstrim on_mnt fstrim -v /mnt
    uraid detail --json /dev/disk/1 >"$O/detail.ublk.json"
    check ublk-degraded grep -q '"degraded": true' "$O/detail.ublk.json"
    check ublk-umount umount /mnt
    check ublk-fsck fsck.ext4 -n -f "$U"
    kill -TERM $SPID
    wait $SPID
    check ublk-sigterm-exit0 test $? = 0
    check ublk-device-gone test ! -e "$U"
    check ublk-superblocks-clean live_clean
else
    check ublk-serve false
fi

mark "export: nbd again, degraded"
ENGINE=sync  # the degraded pass with pread/pwrite, the first two with io_uring
if serve --nbd unix:/tmp/nbd.sock; then
    check nbd2-degraded grep -q degraded /tmp/serve.out
    check nbd2-client-connect nbd_up
    check nbd2-mount mount -t ext4 -o ro /dev/nbd0 /mnt
    check nbd2-files-verify on_mnt sha256sum -c "$O/sums.nbd"
    check nbd2-ublk-file-verifies on_mnt sha256sum -c "$O/sums.ublk"
    check nbd2-umount umount /mnt
    check nbd2-fsck fsck.ext4 -n -f /dev/nbd0
    nbd-client -d /dev/nbd0
    check nbd2-stop uraid stop --control /tmp/ctl.sock
    wait $SPID
    check nbd2-superblocks-clean live_clean
else
    check nbd2-serve false
fi
cat /tmp/serve.err
mark "export: done, $FAILS failed"
[ $FAILS = 0 ]
"""


class AllocationWatch:
    """Allocated bytes of the member images when the guest reaches each phase file."""

    def __init__(self, images: list[Path], out: Path, phases: list[str]):
        self.images, self.out, self.phases = images, out, phases
        self.seen: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def allocated(self) -> int:
        return sum(p.stat().st_blocks * 512 for p in self.images)

    def _run(self) -> None:
        while not self.stop.is_set():
            for ph in self.phases:
                if ph not in self.seen and (self.out / ph).exists():
                    self.seen[ph] = self.allocated()
            self.stop.wait(0.2)


def host_checks(uraid: Path, images: list[Path], out: Path, work: Path) -> list[tuple[str, bool, str]]:
    """The members, read on the host without Linux md, hold a clean ext4 with the files."""
    results = []
    img = work / "array.img"
    r = subprocess.run([str(uraid), "read", "-o", str(img)] + [str(p) for p in images],
                       capture_output=True, text=True)
    results.append(("host-uraid-read", r.returncode == 0, r.stderr))
    if r.returncode != 0:
        return results
    r = subprocess.run(["e2fsck", "-n", "-f", str(img)], capture_output=True, text=True)
    results.append(("host-e2fsck-clean", r.returncode == 0, r.stdout + r.stderr))
    for sums in ("sums.nbd", "sums.ublk"):
        f = out / sums
        if not f.exists():
            results.append((f"host-{sums}", False, "the guest wrote no checksums"))
            continue
        for line in f.read_text().splitlines():
            want, path = line.split()
            inner = path.removeprefix("/mnt")
            r = subprocess.run(["debugfs", "-R", f"cat {inner}", str(img)], capture_output=True)
            got = hashlib.sha256(r.stdout).hexdigest()
            results.append((f"host-file{inner.replace('/', '-')}", got == want,
                            f"sha256 {got}, the guest wrote {want}"))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uraid", help="uraid binary (default $URAID, target/debug/uraid)")
    ap.add_argument("--keep", action="store_true", help="keep the run folder on success")
    ap.add_argument("--timeout-scale", type=float, default=1.0)
    args = ap.parse_args()

    uraid = find_uraid(args.uraid)
    if uraid is None:
        print("FAIL export: no uraid binary (build target/debug/uraid or set URAID)")
        return 3
    nbd_client = shutil.which("nbd-client") or "/usr/sbin/nbd-client"
    if not Path(nbd_client).exists():
        print("FAIL export: nbd-client is not installed (apt-get install nbd-client)")
        return 3
    for tool in ("e2fsck", "debugfs"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists() \
                and not Path(f"/sbin/{tool}").exists():
            print(f"FAIL export: {tool} is not installed (apt-get install e2fsprogs)")
            return 3

    run_dir = CACHE / "runs" / time.strftime("export-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run folder: {run_dir}", flush=True)
    images = []
    for i in range(NDISKS):
        p = run_dir / f"m{i}.img"
        with open(p, "wb") as f:
            f.truncate(MEMBER_MIB * MiB)
        images.append(p)
    r = subprocess.run([str(uraid), "create", "-l", "5", "-n", str(NDISKS), "-N", "export"]
                       + [str(p) for p in images], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL export-create: {r.stderr}")
        return 1

    boot = Boot(run_dir, "vm", Pattern(64 * MiB))
    for p in images:
        boot.add_disk(p, unmap=True)
    boot.guest_bins += [uraid, Path(nbd_client)]
    boot.job.append(GUEST_JOB)
    boot.budget_s = BOOT_BUDGET_S
    watch = AllocationWatch(images, boot.share / "out" / "export", ["phase-scratch", "phase-trimmed"])
    watch.thread.start()
    t0 = time.monotonic()
    boot.boot(args.timeout_scale)
    elapsed = time.monotonic() - t0
    watch.stop.set()
    watch.thread.join()

    out = boot.share / "out" / "export"
    log_path = boot.share / "out" / "job.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    results: list[tuple[str, bool, str]] = []
    for line in log.splitlines():
        if line.startswith("PASS "):
            results.append((line[5:].strip(), True, ""))
        elif line.startswith("FAIL "):
            results.append((line[5:].strip(), False, ""))
    if not boot.finished():
        results.append(("vm", False, f"{boot.vm_problem()}\n{boot.console_tail()}"))
    results += host_checks(uraid, images, out, run_dir)
    # fstrim after deleting a 48 MiB file: raid5 discards the whole stripes of it, and the
    # images (discard=unmap) give the blocks back. At least half of it, data and parity.
    before, after = watch.seen.get("phase-scratch"), watch.seen.get("phase-trimmed")
    freed = (before - after) if before is not None and after is not None else None
    print(f"member images: {before} bytes allocated before fstrim, {after} after", flush=True)
    results.append(("host-fstrim-frees-member-blocks", freed is not None and freed >= 24 * MiB,
                    f"images allocated {before} bytes before fstrim, {after} after"))

    failed = [r for r in results if not r[1]]
    for name, ok, why in results:
        harness.report(name, ok, why="" if ok else (why.splitlines()[0] if why else "see log"),
                       details="" if ok else why)
    if failed:
        print("---- guest log ----")
        print(log[-6000:])
    expected_min = 30  # guest steps + host checks; fewer means the job stopped early
    if len(results) < expected_min and not failed:
        print(f"FAIL export: only {len(results)} checks ran (expected {expected_min}+)")
        failed.append(("count", False, ""))
    print(f"export VM: {elapsed:.0f} s")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if not failed and not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
