#!/usr/bin/env bash
# Reshape throughput (issue 15's benchmark; not a test): a raid5 of 4 file members grown to 5
# with `uraid grow -n 5 --add`, then shrunk back to 4 with `uraid grow -n 4 --array-size`
# (md's backwards reshape, 32 MiB less kept so that the data offset can move up), against
# the raw sequential copy rate of the same number of bytes on the same file system in the
# same run (dd with O_DIRECT, read one file and write another, as the reshape reads the old
# stripes and writes the new ones).
#
#   scripts/bench-reshape.sh [MEMBER_MIB]     (default 1024; URAID_BIN=path; DIR=where to make the scratch dir)
#
# Prints one line per measurement and a summary; uses 6 x MEMBER_MIB of disk in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${URAID_BIN:-target/release/uraid}
MIB=${1:-1024}
[ -x "$BIN" ] || { echo "bench-reshape: build first: cargo build --release -p uraid" >&2; exit 1; }
B=$(realpath "$BIN")
BASE=${DIR:-${TMPDIR:-/var/tmp}}
mkdir -p "$BASE"
DIR=$(mktemp -d "$BASE/uraid-bench-reshape.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
cd "$DIR"
for i in 0 1 2 3 4; do truncate -s "${MIB}M" "m$i"; done
"$B" create -l 5 -c 512K --assume-clean m0 m1 m2 m3 >/dev/null 2>&1
bytes=$("$B" detail --json m0 m1 m2 m3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])')
# Fill the array (so the reshape reads real data), not timed.
head -c "$bytes" /dev/urandom | "$B" write m0 m1 m2 m3 >/dev/null
sync
cpu=$(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //')
echo "cpu: $cpu; members: 4 x $MIB MiB files in $DIR ($(df -T . | awk 'NR==2{print $2}'))"
# Raw sequential copy of the same bytes: read a file, write another, O_DIRECT, 1 MiB blocks.
truncate -s 0 raw-out
head -c "$bytes" /dev/urandom > raw-in; sync
t0=$(date +%s.%N)
dd if=raw-in of=raw-out bs=1M iflag=direct oflag=direct status=none
sync
t1=$(date +%s.%N)
raw=$(python3 -c "print($bytes / ($t1 - $t0) / 1e6)")
rm -f raw-in raw-out
echo "raw copy: $bytes bytes in $(python3 -c "print(round($t1 - $t0, 2))") s = $(printf %.0f "$raw") MB/s"
t0=$(date +%s.%N)
"$B" grow -q -n 5 --add m4 -- m0 m1 m2 m3 2>grow.log
sync
t1=$(date +%s.%N)
grep -q finished grow.log || { cat grow.log; exit 1; }
rs=$(python3 -c "print($bytes / ($t1 - $t0) / 1e6)")
echo "reshape 4 -> 5: $bytes bytes of array data in $(python3 -c "print(round($t1 - $t0, 2))") s = $(printf %.0f "$rs") MB/s"
echo "reshape / raw copy = $(python3 -c "print(round($rs / $raw, 2))")"
# The shrink back to 4 devices, keeping 32 MiB less than the 4-device array held (room after
# the data for the offset to move up into).
keep_k=$(( bytes / 1024 - 32768 ))
t0=$(date +%s.%N)
"$B" grow -q -n 4 --array-size "${keep_k}K" m0 m1 m2 m3 m4 2>shrink.log
sync
t1=$(date +%s.%N)
grep -q finished shrink.log || { cat shrink.log; exit 1; }
sh=$(python3 -c "print($keep_k * 1024 / ($t1 - $t0) / 1e6)")
echo "shrink 5 -> 4: $((keep_k * 1024)) bytes of array data in $(python3 -c "print(round($t1 - $t0, 2))") s = $(printf %.0f "$sh") MB/s"
echo "shrink / raw copy = $(python3 -c "print(round($sh / $raw, 2))")"
