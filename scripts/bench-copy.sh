#!/usr/bin/env bash
# A client's copy of a mostly unwritten array (a benchmark, not a test): `uraid serve` of a
# raid1 over two `nbdkit --no-sr memory` exports (members that cannot say where they were
# never written, as disks), zeroed whole through the export (WRITE_ZEROES), then 64 MiB
# written; `nbdcopy URI null:` three times, milliseconds each. With the array's never-written
# map in its block status nbdcopy reads only what was written.
#
#   scripts/bench-copy.sh [SIZE]   (default 2G; URAID_BIN=path, default target/release/uraid)
#
# Needs nbdkit, nbdcopy, nbdinfo, qemu-io; 2 x SIZE of memory at most.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${URAID_BIN:-target/release/uraid}")
SIZE=${1:-2G}
[ -x "$BIN" ] || { echo "bench-copy: build first: cargo build --release -p uraid" >&2; exit 1; }
for t in nbdkit nbdcopy nbdinfo qemu-io; do
    command -v "$t" >/dev/null || { echo "bench-copy: needs $t" >&2; exit 1; }
done
D=$(mktemp -d /dev/shm/uraid-bench-copy.XXXXXX)
export URAID_RUN_DIR=$D/run URAID_STATE_DIR=$D/state
mkdir -p "$URAID_RUN_DIR" "$URAID_STATE_DIR"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$D"
}
trap cleanup EXIT
for n in a b; do
    nbdkit -f -U "$D/$n.sock" --no-sr memory "$SIZE" &
    pids+=($!)
done
until [ -S "$D/a.sock" ] && [ -S "$D/b.sock" ]; do sleep 0.05; done
M=("nbd+unix:///?socket=$D/a.sock" "nbd+unix:///?socket=$D/b.sock")
"$BIN" create -l 1 -n 2 --assume-clean --run "${M[@]}" >/dev/null 2>&1
"$BIN" serve --name md0 --nbd "unix:$D/s.sock" --control "$D/c.ctl" "${M[@]}" >"$D/serve.log" 2>&1 &
pids+=($!)
until [ -S "$D/c.ctl" ]; do sleep 0.05; done
A="nbd+unix:///md0?socket=$D/s.sock"
size=$(nbdinfo --size "$A")
qemu-io -f raw -c "write -z 0 $size" -c "write -P 0x5a 100M 64M" "$A" >/dev/null
echo "uraid: $BIN; array $size bytes, 64 MiB written; nbdinfo --map:"
nbdinfo --map "$A" | sed 's/^/  /'
for i in 1 2 3; do
    s=$(date +%s%N)
    nbdcopy "$A" null:
    echo "nbdcopy $i: $((($(date +%s%N) - s) / 1000000)) ms"
done
