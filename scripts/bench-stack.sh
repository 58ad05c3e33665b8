#!/usr/bin/env bash
# The whole stack with default flags (issue 18's benchmark; not a test): fio's nbd engine
# over a Unix socket against `uraid serve` of a raid1 over 2 and a raid5 over 4 files on
# tmpfs (the default io engine), and against `nbdkit memory` over a Unix socket, alternated
# in ROUNDS rounds: 4k randrw 70/30 QD64, and 1 MiB sequential writes QD8, SECS seconds each.
# Prints each measurement, then the median of the rounds and its ratio to nbdkit memory.
#
#   scripts/bench-stack.sh [SECS] [ROUNDS]   (default 10 and 3; URAID_BIN=path, default
#                                            target/release/uraid)
#
# SERVE_ARGS="..." adds options to `uraid serve`. Needs nbdkit and fio (nbd engine); 1.5 GiB
# of /dev/shm.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${URAID_BIN:-target/release/uraid}
SECS=${1:-10}
ROUNDS=${2:-3}
[ -x "$BIN" ] || { echo "bench-stack: build first: cargo build --release -p uraid" >&2; exit 1; }
for t in nbdkit fio python3; do
    command -v "$t" >/dev/null || { echo "bench-stack: needs $t" >&2; exit 1; }
done
B=$(realpath "$BIN")
DIR=$(mktemp -d /dev/shm/uraid-bench-stack.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
cd "$DIR"
export URAID_RUN_DIR=$DIR/run
mkdir -p "$URAID_RUN_DIR"
cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
echo "cpu: $cpu ($(nproc) cpus); uraid: $B; fio: $(fio --version); nbdkit: $(nbdkit --version | head -1)"

wait_sock() { until [ -S "$1" ]; do sleep 0.05; done; }
nbdkit -f -U "$DIR/nbdkit.sock" memory 1G &
pids+=($!)
wait_sock "$DIR/nbdkit.sock"
serve_level() { # LEVEL N: an array over N tmpfs files of 256 MiB, served on LEVEL.sock
    local level=$1 n=$2 i members=()
    for i in $(seq 0 $((n - 1))); do truncate -s 256M "r$level-$i.img"; members+=("r$level-$i.img"); done
    "$B" create -l "$level" -n "$n" --assume-clean --run "${members[@]}" >/dev/null 2>&1
    "$B" serve --name md0 --nbd "unix:$DIR/$level.sock" --control "$DIR/$level.ctl" ${SERVE_ARGS:-} "${members[@]}" \
        >"serve-$level.log" 2>&1 &
    pids+=($!)
    wait_sock "$DIR/$level.ctl"
}
serve_level 1 2
serve_level 5 4
declare -A URI=(
    [nbdkit]="nbd+unix:///?socket=$DIR/nbdkit.sock"
    [raid1]="nbd+unix:///md0?socket=$DIR/1.sock"
    [raid5]="nbd+unix:///md0?socket=$DIR/5.sock"
)

# fio JOB URI -> "MB/s IOPS" (reads and writes together)
run_fio() {
    local args
    case $1 in
        randrw) args=(--rw=randrw --rwmixread=70 --bs=4k --iodepth=64) ;;
        seqwrite) args=(--rw=write --bs=1M --iodepth=8) ;;
    esac
    fio --name=bench --ioengine=nbd --uri="$2" "${args[@]}" --size=200m --time_based \
        --runtime="$SECS" --ramp_time=1 --output-format=json >fio.json
    python3 -c 'import json; t=open("fio.json").read(); j=json.loads(t[t.index("{"):])["jobs"][0]
r, w = j["read"], j["write"]
print("%.1f %.0f" % ((r["bw_bytes"] + w["bw_bytes"]) / 1e6, r["iops"] + w["iops"]))'
}

declare -A got
for round in $(seq 1 "$ROUNDS"); do
    for m in "nbdkit randrw" "raid1 randrw" "raid5 randrw" "nbdkit seqwrite" "raid5 seqwrite"; do
        read -r target job <<<"$m"
        f=$(run_fio "$job" "${URI[$target]}")
        echo "round $round: $target $job: $f (MB/s IOPS)"
        got[$target.$job]+="${f% *} "
    done
done
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" $1; }
for job in randrw seqwrite; do
    base=$(median "${got[nbdkit.$job]}")
    for target in raid1 raid5; do
        [ -n "${got[$target.$job]:-}" ] || continue
        m=$(median "${got[$target.$job]}")
        echo "median $target $job: $m MB/s against nbdkit memory $base MB/s: $(python3 -c "print('%.2fx' % ($m / $base))")"
    done
done
