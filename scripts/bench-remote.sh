#!/usr/bin/env bash
# Remote members (issue 16's benchmark; not a test): fio's nbd engine against `uraid serve`
# of a raid1 over 2 and a raid5 over 4 nbdkit memory members on loopback TCP, and against one
# such nbdkit member directly, in the same run: 4k randrw QD64 (70% reads) and 1M sequential
# read and write, each for SECS seconds. Prints one line per measurement, with the ratio to
# the single member. Then the recovery of a raid1 member on an nbdkit file export (1 GiB,
# loopback TCP) after 64 MiB were written without it: re-added (the bitmap's dirty chunks
# only) against added back empty (a full rebuild), each timed from `uraid add` to the end
# of `uraid wait`.
#
#   scripts/bench-remote.sh [SECS]     (default 20; URAID_BIN=path, default target/release/uraid)
#
# HOST_DELAY_MS=N gives every nbdkit host a service time of N ms per read and per write
# (nbdkit's delay filter), as a remote disk or link has: each host then serves at most its
# own threads' worth of requests per N ms, whatever the shared CPUs do, which is what two
# hosts on their own machines are. Unset, the hosts are nbdkit memory at CPU speed and the
# ratios measure uraid's per-request CPU against nbdkit's on the same CPUs.
# RECOVERY=0 leaves out the re-add/rebuild timing.
#
# Needs nbdkit and fio (nbd engine). Uses ports 10901-10909 on 127.0.0.1; memory, and 2 GiB
# of sparse files under TMPDIR (default /var/tmp) for the recovery.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${URAID_BIN:-target/release/uraid}
SECS=${1:-20}
[ -x "$BIN" ] || { echo "bench-remote: build first: cargo build --release -p uraid" >&2; exit 1; }
for t in nbdkit fio python3; do
    command -v "$t" >/dev/null || { echo "bench-remote: needs $t" >&2; exit 1; }
done
B=$(realpath "$BIN")
DIR=$(mktemp -d "${TMPDIR:-/var/tmp}/uraid-bench-remote.XXXXXX")
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

delay=()
if [ -n "${HOST_DELAY_MS:-}" ]; then
    delay=(--filter=delay "delay-read=${HOST_DELAY_MS}ms" "delay-write=${HOST_DELAY_MS}ms")
fi
host() { # PORT: an nbdkit memory member on 127.0.0.1:PORT
    nbdkit -f -i 127.0.0.1 -p "$1" "${delay[@]}" memory 2G &
    pids+=($!)
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null; do
        sleep 0.05
    done
}
uri() { echo "nbd://127.0.0.1:$1/"; }

cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
echo "cpu: $cpu ($(nproc) cpus); uraid: $B; fio: $(fio --version); nbdkit: $(nbdkit --version | head -1); host delay: ${HOST_DELAY_MS:-none} ms"

# fio JOB URI -> "read_MBps write_MBps read_iops write_iops"
run_fio() {
    local job=$1 u=$2 args
    case $job in
        randrw) args=(--rw=randrw --rwmixread=70 --bs=4k --iodepth=64) ;;
        seqread) args=(--rw=read --bs=1M --iodepth=8) ;;
        seqwrite) args=(--rw=write --bs=1M --iodepth=8) ;;
    esac
    fio --name=bench --ioengine=nbd --uri="$u" "${args[@]}" --size=1g --time_based \
        --runtime="$SECS" --ramp_time=2 --output-format=json >fio.json
    # fio's nbd engine prints a line before the JSON.
    python3 -c 'import json; t=open("fio.json").read(); j=json.loads(t[t.index("{"):])["jobs"][0]
print("%.1f %.1f %.0f %.0f" % (j["read"]["bw_bytes"]/1e6, j["write"]["bw_bytes"]/1e6, j["read"]["iops"], j["write"]["iops"]))'
}

declare -A base
report() { # NAME JOB FIGURES
    read -r rmb wmb riops wiops <<<"$3"
    if [ "$1" = single ]; then base[$2]="$3"; fi
    read -r brmb bwmb _ _ <<<"${base[$2]}"
    ratio() { python3 -c "print('%.2fx' % ($1 / $2) if $2 > 0 else '-')"; }
    echo "$1 $2: read $rmb MB/s ($riops IOPS, $(ratio "$rmb" "$brmb")), write $wmb MB/s ($wiops IOPS, $(ratio "$wmb" "$bwmb"))"
}

host 10906
for job in randrw seqread seqwrite; do
    # Something to read on the raw member first.
    [ "$job" = seqread ] && fio --name=fill --ioengine=nbd --uri="$(uri 10906)" --rw=write --bs=1M --size=1g --output-format=json >/dev/null
    report single "$job" "$(run_fio "$job" "$(uri 10906)")"
done

serve_level() { # LEVEL N PORT...
    local level=$1 n=$2; shift 2
    local members=() p
    for p in "$@"; do host "$p"; members+=("$(uri "$p")"); done
    "$B" create -l "$level" -n "$n" --assume-clean --run "${members[@]}" >/dev/null 2>&1
    "$B" serve --name md0 --nbd "unix:$DIR/$level.sock" --control "$DIR/$level.ctl" "${members[@]}" \
        >"serve-$level.log" 2>&1 &
    pids+=($!)
    until [ -S "$DIR/$level.ctl" ]; do sleep 0.05; done
    local u="nbd+unix:///md0?socket=$DIR/$level.sock"
    for job in randrw seqread seqwrite; do
        [ "$job" = seqread ] && fio --name=fill --ioengine=nbd --uri="$u" --rw=write --bs=1M --size=1g --output-format=json >/dev/null
        report "raid$level" "$job" "$(run_fio "$job" "$u")"
    done
}
serve_level 1 2 10901 10902
serve_level 5 4 10903 10904 10905 10907

# Re-add against full rebuild: raid1 over two nbdkit file members, filled, member 1 failed
# and removed, 64 MiB written at the start, then member 1 added back.
readd_vs_rebuild() {
    local f0=$DIR/r0.img f1=$DIR/r1.img p
    truncate -s 1G "$f0" "$f1"
    for p in 10908 10909; do
        local f=$f0; [ "$p" = 10909 ] && f=$f1
        nbdkit -f -i 127.0.0.1 -p "$p" file "$f" &
        pids+=($!)
        until python3 -c "import socket; socket.create_connection(('127.0.0.1', $p), 1)" 2>/dev/null; do
            sleep 0.05
        done
    done
    local m0 m1 ctl=$DIR/readd.ctl
    m0=$(uri 10908) m1=$(uri 10909)
    "$B" create -l 1 -n 2 --bitmap internal --assume-clean --run "$m0" "$m1" >/dev/null 2>&1
    # No speed limit: the rate of the recovery itself.
    "$B" serve --name md0 --speed-max 100000000 --nbd "unix:$DIR/readd.sock" --control "$ctl" \
        "$m0" "$m1" >serve-readd.log 2>&1 &
    pids+=($!)
    until [ -S "$ctl" ]; do sleep 0.05; done
    local u="nbd+unix:///md0?socket=$DIR/readd.sock"
    fio --name=fill --ioengine=nbd --uri="$u" --rw=write --bs=1M --size=1g --output-format=json >/dev/null
    local chunk
    chunk=$("$B" detail --json --control "$ctl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bitmap_pages"]["chunk_kib"])')
    out_and_back() { # what happens to member 1 while it is out (a command), then it is timed back
        # The bitmap daemon clears a chunk's bit once it has been idle for two passes of
        # daemon_sleep (5 s), as md's does; failed before that, every chunk the fill
        # wrote would still be dirty and the re-add would copy them all.
        sleep 12
        "$B" fail --control "$ctl" 1 >/dev/null
        "$B" remove --control "$ctl" 1 >/dev/null
        fio --name=out --ioengine=nbd --uri="$u" --rw=write --bs=1M --size=64m --output-format=json >/dev/null
        "$@"
        local t0 t1
        t0=$(date +%s.%N)
        "$B" add --control "$ctl" "$m1" >/dev/null
        "$B" wait --control "$ctl" >/dev/null
        t1=$(date +%s.%N)
        python3 -c "print('%.2f' % ($t1 - $t0))"
    }
    local readd rebuild
    readd=$(out_and_back true)
    # Its disk swapped for an empty one: no superblock, so a full rebuild.
    rebuild=$(out_and_back sh -c "truncate -s 0 '$f1' && truncate -s 1G '$f1'")
    echo "raid1 recovery after 64 MiB written (bitmap chunk $chunk KiB, 1 GiB members): re-add ${readd} s, full rebuild ${rebuild} s ($(python3 -c "print('%.1fx' % ($rebuild / $readd))") longer)"
}
[ "${RECOVERY:-1}" = 0 ] || readd_vs_rebuild
