#!/usr/bin/env bash
# Ablation of the raid4/5/6 write-path knobs (md's sysfs names), each varied alone from the
# defaults, on raid5 over 4 brd-like memory members: 4 KiB randwrite and 1 MiB seqwrite.
# Prints a markdown table. Usage: scripts/bench-ablation.sh [JOBS] [REPEAT]
# DEFAULTS below is uraid's (`uraid bench --help`; crates/cli/tests/cli.rs checks that it
# agrees, and that every knob has a row away from its default). skip_copy is on by default
# in uraid (md's is off), so its row is "off".
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-16}
REPEAT=${2:-3}
BIN=${URAID_BIN:-target/release/uraid}
COMMON=(--level raid5:4 --jobs "$JOBS" --runtime 2s --ramp 0.5s --repeat "$REPEAT" --json)
DEFAULTS="group_thread_cnt 0, rmw_level 1, skip_copy on, stripe_cache_size 256, batching on"
SETTINGS=(
  "defaults|"
  "group_thread_cnt 1|--group-thread-cnt 1"
  "group_thread_cnt 2|--group-thread-cnt 2"
  "rmw_level 0|--rmw-level 0"
  "rmw_level 2|--rmw-level 2"
  "skip_copy off|--skip-copy off"
  "stripe_cache_size 1024|--stripe-cache-size 1024"
  "stripe_cache_size 4096|--stripe-cache-size 4096"
  "batching off|--no-batching"
)
row() { # json -> "IOPS or MB/s (CPU us/rq, member IOs/rq, own MiB)"
  jq -r --arg u "$1" '.points[0] | if $u == "iops" then
      "\(.iops/1000 | floor) K IOPS (\(.cpu_us_per_request*100|round/100) us, \(.member_ios_per_request*100|round/100) io/rq, \(.own_mib|round) MiB)"
    else
      "\(.mb_per_s|round) MB/s (\(.cpu_us_per_request|round) us, \(.member_ios_per_request*100|round/100) io/rq, \(.own_mib|round) MiB)"
    end'
}
echo "| setting (defaults: $DEFAULTS) | 4 KiB randwrite, $JOBS jobs | 1 MiB seqwrite, $JOBS jobs, 128 KiB chunk |"
echo "|---|---|---|"
for s in "${SETTINGS[@]}"; do
  name=${s%%|*}
  flags=${s#*|}
  # shellcheck disable=SC2086
  r=$("$BIN" bench "${COMMON[@]}" --rw randwrite --bs 4k $flags | row iops)
  # shellcheck disable=SC2086
  w=$("$BIN" bench "${COMMON[@]}" --rw seqwrite --bs 1M --chunk 128K $flags | row mbs)
  echo "| $name | $r | $w |"
done
