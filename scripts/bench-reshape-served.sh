#!/usr/bin/env bash
# fio through NBD during a served reshape, against the same array idle (issue 15's second
# benchmark; not a test). A raid5 of 4 file members is served; `uraid grow -n 5 --add` starts
# the 4 -> 5 grow on the served array while fio runs (the array is built again under it: fio's
# longest request is the pause); the server then moves the data at --speed-max while fio (nbd
# engine, 4k randrw 70/30, iodepth 16) runs; after the reshape ends the same fio runs on the
# array served on in its new shape by the same process, and again after a restart.
#
#   scripts/bench-reshape-served.sh [MEMBER_MIB] [SPEED_KIB_S]   (default 256 and 50000;
#                                       URAID_BIN=path; DIR=where to make the scratch dir;
#                                       RUNTIME=fio seconds, default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${URAID_BIN:-target/release/uraid}
MIB=${1:-256}
SPEED=${2:-50000}
RUNTIME=${RUNTIME:-10}
[ -x "$BIN" ] || { echo "bench-reshape-served: build first: cargo build --release -p uraid" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench-reshape-served: needs fio" >&2; exit 1; }
B=$(realpath "$BIN")
BASE=${DIR:-${TMPDIR:-/var/tmp}}
mkdir -p "$BASE"
DIR=$(mktemp -d "$BASE/uraid-bench-rs-served.XXXXXX")
SRV=
trap '[ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$DIR"' EXIT
cd "$DIR"
for i in 0 1 2 3 4; do truncate -s "${MIB}M" "m$i"; done
"$B" create -l 5 -c 512K --assume-clean m0 m1 m2 m3 >/dev/null 2>&1
bytes=$("$B" detail --json m0 m1 m2 m3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])')
head -c "$bytes" /dev/urandom | "$B" write m0 m1 m2 m3 >/dev/null
cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
echo "cpu: $cpu; members: 5 x $MIB MiB files in $DIR ($(df -T . | awk 'NR==2{print $2}')); reshape at --speed-max $SPEED KiB/s"
export URAID_RUN_DIR="$DIR/run"
mkdir -p "$URAID_RUN_DIR"
"$B" serve --nbd "unix:$DIR/nbd.sock" --control "$DIR/ctl.sock" --name md0 --speed-max "$SPEED" \
    m0 m1 m2 m3 >serve.log 2>&1 &
SRV=$!
for _ in $(seq 100); do [ -S "$DIR/ctl.sock" ] && break; sleep 0.1; done
reshaping() { "$B" detail --json --control "$DIR/ctl.sock" | python3 -c 'import json,sys; s=json.load(sys.stdin).get("sync"); print("yes" if s and s.get("kind")=="reshape" else "no")'; }
fio_iops() {
    fio --name=rs --ioengine=nbd --uri="nbd+unix:///md0?socket=$DIR/nbd.sock" --rw=randrw \
        --rwmixread=70 --bs=4k --iodepth=16 --size="$bytes" --time_based --runtime="$RUNTIME" \
        --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}
# The grow started under fio: its errors and its longest request.
fio --name=rs --ioengine=nbd --uri="nbd+unix:///md0?socket=$DIR/nbd.sock" --rw=randrw \
    --rwmixread=70 --bs=4k --iodepth=16 --size="$bytes" --time_based --runtime=6 \
    --output-format=json >fio-grow.json 2>/dev/null &
FIO=$!
sleep 2
g0=$(date +%s.%N)
"$B" grow -q -n 5 --add m4 --control "$DIR/ctl.sock" 2>grow.log
g1=$(date +%s.%N)
wait "$FIO"
pause=$(python3 -c 'import json,sys; t=open("fio-grow.json").read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(j["error"], round(max(j["read"]["clat_ns"]["max"], j["write"]["clat_ns"]["max"])/1e6, 1))')
[ "$(reshaping)" = yes ] || { echo "the reshape is not running"; cat serve.log grow.log; exit 1; }
t0=$(date +%s.%N)
during=$(fio_iops)
still=$(reshaping)
[ "$still" = yes ] || echo "NOTE: the reshape ended before fio did; raise MEMBER_MIB or lower SPEED_KIB_S"
while [ "$(reshaping)" = yes ]; do sleep 0.2; done
t1=$(date +%s.%N)
idle=$(fio_iops)
"$B" stop --control "$DIR/ctl.sock" >/dev/null 2>&1 || kill "$SRV"
wait "$SRV" 2>/dev/null || true
# Started again: the finished array in its own raid5 personality.
"$B" serve --nbd "unix:$DIR/nbd.sock" --control "$DIR/ctl.sock" --name md0 m0 m1 m2 m3 m4 \
    >serve2.log 2>&1 &
SRV=$!
for _ in $(seq 100); do [ -S "$DIR/ctl.sock" ] && break; sleep 0.1; done
native=$(fio_iops)
echo "uraid grow -n 5 on the served array: $(python3 -c "print(round($g1 - $g0, 2))") s; fio under it: error ${pause% *}, longest request ${pause#* } ms"
echo "fio 4k randrw 70/30 QD16 over NBD during the reshape:        $during IOPS"
echo "the same right after it (same process, new shape):           $idle IOPS"
echo "the same after a restart (raid5, 5 devices):                 $native IOPS"
echo "during / after a restart = $(python3 -c "print(round($during / $native, 2))"); right after / after a restart = $(python3 -c "print(round($idle / $native, 2))")"
echo "reshape (with fio running part of the time): $(python3 -c "print(round($t1 - $t0, 1))") s for $bytes bytes"
"$B" stop --control "$DIR/ctl.sock" >/dev/null 2>&1 || kill "$SRV"
wait "$SRV" 2>/dev/null || true
SRV=
