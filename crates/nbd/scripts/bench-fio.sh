#!/bin/sh
# Compares uraid-nbd (MemBackend, examples/serve_mem) with `nbdkit memory`
# under fio's nbd engine, alternating them so both see the same machine noise.
# Usage: crates/nbd/scripts/bench-fio.sh [ROUNDS] [SECONDS] [EXTRA FIO ARGS...]
# Needs: fio (with the nbd engine), nbdkit, a release build of the example:
#   CARGO_TARGET_DIR=target-nbd cargo build --release -p uraid-nbd --example serve_mem
set -eu
ROUNDS=${1:-3}
SECS=${2:-10}
shift 2 2>/dev/null || true
TARGET=${CARGO_TARGET_DIR:-target-nbd}
DIR=$(mktemp -d)
trap 'kill $U_PID $K_PID 2>/dev/null; rm -rf "$DIR"' EXIT
"$TARGET/release/examples/serve_mem" "$DIR/uraid.sock" 1024 2>/dev/null &
U_PID=$!
nbdkit -f -U "$DIR/nbdkit.sock" memory 1G &
K_PID=$!
sleep 1
run() {
    sock=$1
    shift
    fio --name=bench --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
        --rw=randrw --rwmixread=70 --bs=4k --iodepth=64 --numjobs=1 \
        --size=1g --time_based --runtime="$SECS" --ramp_time=1 \
        --group_reporting --output-format=json "$@" 2>/dev/null |
        sed -n '/^{/,$p' |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(int(j["read"]["iops"]+j["write"]["iops"]))'
}
i=0
while [ "$i" -lt "$ROUNDS" ]; do
    u=$(run "$DIR/uraid.sock" "$@")
    k=$(run "$DIR/nbdkit.sock" "$@")
    echo "round $i: uraid $u IOPS, nbdkit-memory $k IOPS, ratio $(python3 -c "print(round($u/$k,2))")"
    i=$((i + 1))
done
