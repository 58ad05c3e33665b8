#!/usr/bin/env bash
# Remote members (issue 16's benchmark; not a test): fio's nbd engine against `uraid serve`
# of a raid1 over 2 and a raid5 over 4 nbdkit memory members, each member a host in its own
# network namespace, and against one such member directly, in the same run. Jobs (JOBS="..."
# picks some), each for SECS seconds: 4k randrw QD64 (70% reads), 1M sequential read (QD8),
# 4k random read and 4k random write (QD64), 1M sequential write (QD8). Prints one line per
# measurement, with the ratio to the single member. Then the recovery of a raid1 member on
# an nbdkit file export (1 GiB) after 64 MiB were written without it: re-added (the
# bitmap's dirty chunks only) against added back empty (a full rebuild), each timed from
# `uraid add` to the end of `uraid wait`.
#
#   scripts/bench-remote.sh [SECS]     (default 20; URAID_BIN=path, default target/release/uraid)
#
# HOST_DELAY_MS=N gives every nbdkit host a service time of N ms per read and per write
# (nbdkit's delay filter), as a remote disk or link has: each host then serves at most its
# own threads' worth of requests per N ms (nbdkit's 16 per connection), whatever the shared
# CPUs do, which is what hosts on machines of their own are. Unset, the hosts are nbdkit
# memory at CPU speed and, with every process on this machine's CPUs, the ratios measure
# uraid's per-request CPU against nbdkit's.
# NETNS=0 puts every host on 127.0.0.1 instead of namespaces (the default without root).
# RECOVERY=0 leaves out the re-add/rebuild timing; LEVELS="1" (or "5") serves one array
# only; SERVE_ARGS="..." adds options to `uraid serve`.
#
# Needs nbdkit and fio (nbd engine), and ip(8) and root for the namespaces. Uses ports
# 10901-10909 and the addresses 10.232.1.0-10.232.9.3 inside the namespaces it makes;
# memory, and 2 GiB of sparse files under TMPDIR (default /var/tmp) for the recovery.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${URAID_BIN:-target/release/uraid}
SECS=${1:-20}
JOBS=${JOBS:-randrw seqread randread randwrite seqwrite}
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
    for n in "${nss[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT
cd "$DIR"
export URAID_RUN_DIR=$DIR/run
mkdir -p "$URAID_RUN_DIR"

filter=() delay=()
if [ -n "${HOST_DELAY_MS:-}" ]; then
    filter=(--filter=delay) delay=("delay-read=${HOST_DELAY_MS}ms" "delay-write=${HOST_DELAY_MS}ms")
fi
# Each host in its own network namespace, joined to this one by a veth pair, as issue 16's
# tests do (NETNS=1, the default as root with ip(8)); NETNS=0: every host on 127.0.0.1.
# The bench's addresses are 10.232.N.0/30, N = PORT - 10900, which exist only inside them.
NETNS=${NETNS:-$([ "$(id -u)" = 0 ] && command -v ip >/dev/null && echo 1 || echo 0)}
nss=()
addr() { if [ "$NETNS" = 1 ]; then echo "10.232.$(($1 - 10900)).2"; else echo 127.0.0.1; fi; }
netns() { # PORT: the namespace of host PORT, made; prints the command prefix to run in it
    local n=$(($1 - 10900)) ns="urb-$(($1 - 10900))"
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    nss+=("$ns")
    ip link add "urb$n" type veth peer name "urbp$n" netns "$ns"
    ip addr add "10.232.$n.1/30" dev "urb$n"
    ip link set "urb$n" up
    ip -n "$ns" addr add "10.232.$n.2/30" dev "urbp$n"
    ip -n "$ns" link set "urbp$n" up
    ip -n "$ns" link set lo up
}
start_host() { # PORT NBDKIT-ARGS...: nbdkit on host PORT, waited for
    local p=$1 a; shift
    a=$(addr "$p")
    if [ "$NETNS" = 1 ]; then
        netns "$p"
        ip netns exec "urb-$((p - 10900))" nbdkit -f -i "$a" -p "$p" "$@" &
    else
        nbdkit -f -i "$a" -p "$p" "$@" &
    fi
    pids+=($!)
    until python3 -c "import socket; socket.create_connection(('$a', $p), 1)" 2>/dev/null; do
        sleep 0.05
    done
}
host() { start_host "$1" "${filter[@]}" memory 2G "${delay[@]}"; } # PORT: an nbdkit memory member
uri() { echo "nbd://$(addr "$1"):$1/"; }

cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
echo "cpu: $cpu ($(nproc) cpus); uraid: $B; fio: $(fio --version); nbdkit: $(nbdkit --version | head -1); host delay: ${HOST_DELAY_MS:-none} ms; namespaces: $NETNS"

# fio JOB URI -> "read_MBps write_MBps read_iops write_iops"
run_fio() {
    local job=$1 u=$2 args
    case $job in
        randrw) args=(--rw=randrw --rwmixread=70 --bs=4k --iodepth=64) ;;
        randread) args=(--rw=randread --bs=4k --iodepth=64) ;;
        randwrite) args=(--rw=randwrite --bs=4k --iodepth=64) ;;
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

run_jobs() { # NAME URI: every job of JOBS; the first read job finds 1 GiB written
    local filled=0 job
    for job in $JOBS; do
        if [ $filled = 0 ] && [[ $job == *read ]]; then
            fio --name=fill --ioengine=nbd --uri="$2" --rw=write --bs=1M --size=1g --output-format=json >/dev/null
            filled=1
        fi
        report "$1" "$job" "$(run_fio "$job" "$2")"
    done
}

host 10906
run_jobs single "$(uri 10906)"

serve_level() { # LEVEL N PORT...
    local level=$1 n=$2; shift 2
    local members=() p
    for p in "$@"; do host "$p"; members+=("$(uri "$p")"); done
    "$B" create -l "$level" -n "$n" --assume-clean --run "${members[@]}" >/dev/null 2>&1
    "$B" serve --name md0 --nbd "unix:$DIR/$level.sock" --control "$DIR/$level.ctl" ${SERVE_ARGS:-} "${members[@]}" \
        >"serve-$level.log" 2>&1 &
    pids+=($!)
    until [ -S "$DIR/$level.ctl" ]; do sleep 0.05; done
    local u="nbd+unix:///md0?socket=$DIR/$level.sock"
    run_jobs "raid$level" "$u"
}
for level in ${LEVELS:-1 5}; do
    case $level in
        1) serve_level 1 2 10901 10902 ;;
        5) serve_level 5 4 10903 10904 10905 10907 ;;
    esac
done

# Re-add against full rebuild: raid1 over two nbdkit file members, filled, member 1 failed
# and removed, 64 MiB written at the start, then member 1 added back.
readd_vs_rebuild() {
    local f0=$DIR/r0.img f1=$DIR/r1.img p
    truncate -s 1G "$f0" "$f1"
    for p in 10908 10909; do
        local f=$f0; [ "$p" = 10909 ] && f=$f1
        start_host "$p" file "$f"
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
