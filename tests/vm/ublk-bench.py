#!/usr/bin/env python3
"""Benchmark (issue 18): uraid's ublk export against Linux md on the same brd members in the
same guest (the harness's Debian 6.12 VM, TCG). Python 3.11 stdlib only.

    tests/vm/ublk-bench.py [--rounds 3] [--runtime 20] [--uraid PATH] [--inline auto,never]
                           [--serve-args "--io-engine sync"]

For raid1 (2 members) and raid5 (4 members, 64 KiB chunk) on brd ramdisks of 128 MiB,
alternating in each round: Linux md (`mdadm --create --assume-clean`, fio on /dev/md0, stop,
zero the superblocks) and uraid (`uraid create --assume-clean` on the same ramdisks,
`uraid serve --ublk --no-nbd`, fio on /dev/ublkbN, `uraid stop`). fio: libaio, direct, 4k
randrw 70/30, iodepth 32, 2 jobs, time based. Prints each run's IOPS (read + write) and the
medians per level with the uraid/md ratio. Build uraid optimized first (`cargo build -p
uraid --profile test` or `--release`): the debug build's parity is unoptimized.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import CACHE, MiB, Boot, Pattern, find_uraid  # noqa: E402

GUEST_JOB = r"""
O=/share/out/bench
mkdir -p "$O"
insmod /share/brd.ko rd_nr=4 rd_size=131072 || { echo "FAIL brd"; exit 1; }
FIO="--name=b --rw=randrw --rwmixread=70 --bs=4k --ioengine=libaio --iodepth=32 --numjobs=2 \
    --direct=1 --time_based --runtime=$RUNTIME --ramp_time=2 --size=96M --group_reporting \
    --output-format=json"
mark() { echo "@@ $(cut -d' ' -f1 /proc/uptime) $*" >/dev/ttyS0; echo "== $*"; }
devs() { _d=""; _i=0; while [ $_i -lt $1 ]; do _d="$_d /dev/ram$_i"; _i=$((_i + 1)); done; echo $_d; }
zero() { for d in $(devs 4); do dd if=/dev/zero of=$d bs=1M count=4 2>/dev/null; done; }
run_md() {  # LEVEL N ROUND
    zero
    _c=""; [ $1 = 5 ] && _c="--chunk=64"
    mdadm --create /dev/md0 --run --assume-clean --metadata=1.2 --level=$1 -n $2 $_c \
        --bitmap=none $(devs $2) >/dev/null 2>&1 || { echo "FAIL md-create raid$1"; return; }
    fio $FIO --filename=/dev/md0 --output="$O/md-raid$1-$3.json"
    mdadm --stop /dev/md0 >/dev/null
}
run_uraid() {  # LEVEL N ROUND INLINE
    zero
    _c=""; [ $1 = 5 ] && _c="-c 64"
    uraid create --assume-clean -l $1 -n $2 $_c -b none -N bench $(devs $2) >/dev/null \
        || { echo "FAIL uraid-create raid$1"; return; }
    rm -f /tmp/ctl.sock /tmp/serve.out  # else the wait below may see the last run's line
    env URAID_UBLK_INLINE=$4 ${WORKERS:+URAID_UBLK_WORKERS=$WORKERS} uraid serve --ublk --no-nbd --control /tmp/ctl.sock $SERVE_ARGS $(devs $2) >/tmp/serve.out 2>>"$O/serve.err" &
    _p=$!
    _i=0
    until grep -q '^ublk: ' /tmp/serve.out; do
        _i=$((_i + 1)); [ $_i -gt 600 ] && { echo "FAIL uraid-serve raid$1"; return; }; sleep 0.1
    done
    _u=$(grep '^ublk: ' /tmp/serve.out | cut -d' ' -f2)
    fio $FIO --filename=$_u --output="$O/uraid-$4-raid$1-$3.json"
    uraid stop --control /tmp/ctl.sock >/dev/null
    wait $_p
}
r=1
while [ $r -le $ROUNDS ]; do
    for lv in "1 2" "5 4"; do
        set -- $lv
        # Alternate which goes first, so neither always runs on a warmer guest.
        if [ $((r % 2)) = 1 ]; then
            mark "round $r raid$1 md"; run_md $1 $2 $r
            for m in $INLINE; do mark "round $r raid$1 uraid $m"; run_uraid $1 $2 $r $m; done
        else
            for m in $INLINE; do mark "round $r raid$1 uraid $m"; run_uraid $1 $2 $r $m; done
            mark "round $r raid$1 md"; run_md $1 $2 $r
        fi
    done
    r=$((r + 1))
done
mark "bench done"
"""


def iops(path: Path) -> float | None:
    try:
        text = path.read_text(errors="replace")
        j = json.loads(text[text.index("{"):])
    except (OSError, ValueError):
        return None
    job = j["jobs"][0]
    return job["read"]["iops"] + job["write"]["iops"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=20, help="seconds per fio run")
    ap.add_argument("--uraid")
    ap.add_argument("--workers", type=int, help="URAID_UBLK_WORKERS for uraid serve")
    ap.add_argument("--serve-args", default="", help="more options for uraid serve")
    ap.add_argument("--inline", default="auto",
                    help="comma-separated URAID_UBLK_INLINE modes to run uraid with, each "
                         "beside md in every round (auto, always, never)")
    args = ap.parse_args()
    modes = [m for m in args.inline.split(",") if m]
    if not modes or any(m not in ("auto", "always", "never") for m in modes):
        print(f"--inline {args.inline}: modes are auto, always, never")
        return 2
    uraid = find_uraid(args.uraid)
    fio = shutil.which("fio")
    if uraid is None or fio is None:
        print("need uraid (cargo build -p uraid) and fio on the host")
        return 3
    kmod = next((CACHE / "kpkg" / "lib" / "modules").glob("*/kernel/drivers/block/brd.ko.xz"))
    run_dir = CACHE / "runs" / time.strftime("ublk-bench-%Y%m%d-%H%M%S")
    boot = Boot(run_dir, "vm", Pattern(64 * MiB))
    boot.share.mkdir(parents=True, exist_ok=True)
    (boot.share / "brd.ko").write_bytes(lzma.decompress(kmod.read_bytes()))
    boot.guest_bins += [uraid, Path(fio)]
    boot.job.append(f"RUNTIME={args.runtime}\nROUNDS={args.rounds}\n"
                    f"WORKERS={args.workers or ''}\nSERVE_ARGS={shlex.quote(args.serve_args)}\n"
                    f"INLINE={shlex.quote(' '.join(modes))}\n" + GUEST_JOB)
    boot.budget_s = 120 + args.rounds * 2 * (1 + len(modes)) * (args.runtime + 70)
    boot.boot(1.0)
    out = boot.share / "out" / "bench"
    ok = True
    for lv in (1, 5):
        got = {}
        for who in ["md"] + [f"uraid-{m}" for m in modes]:
            vals = [iops(out / f"{who}-raid{lv}-{r}.json") for r in range(1, args.rounds + 1)]
            print(f"raid{lv} {who:12}: " + " ".join("-" if v is None else f"{v:.0f}" for v in vals))
            vals = [v for v in vals if v is not None]
            got[who] = statistics.median(vals) if vals else None
        for m in modes:
            u = got[f"uraid-{m}"]
            if got["md"] and u:
                print(f"raid{lv} median IOPS: md {got['md']:.0f}, uraid (inline {m}) {u:.0f}, "
                      f"uraid/md {u / got['md']:.2f}x")
            else:
                ok = False
    if not boot.finished():
        print(f"VM: {boot.vm_problem()}\n{boot.console_tail()}")
        ok = False
    log = boot.share / "out" / "job.log"
    if not ok and log.exists():
        print(log.read_text(errors="replace")[-4000:])
    print(f"run folder: {run_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
