#!/usr/bin/env bash
# md's partial parity log (raid5 --consistency-policy=ppl) both ways, against Linux 6.12:
# 1. Linux creates a PPL raid5 and writes a pattern, stops cleanly; uraid reads the same
#    bytes, detail/examine name the policy and the PPL area, check finds 0 mismatches.
# 2. uraid creates a PPL raid5 and fills it; md assembles it clean (no resync), same bytes,
#    md's check finds 0 mismatches.
# 3. md writes to the PPL array of (1) and the VM is crashed (sysrq b) mid-write; uraid
#    assembles it (PPL recovery), the acknowledged write reads back, parity is consistent.
#
#   tests/vm/ppl.sh            (URAID=path/to/uraid to pick the binary)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
URAID="${URAID:-$ROOT/target/debug/uraid}"
"$HERE/setup.sh" >/dev/null
. "$HERE/scratch.sh"
W="$(vm_scratch ppl-vm 200)"
trap 'rm -rf "$W"' EXIT
cd "$W"
LEN=$((4 << 20))
truncate -s 24M m0 m1 m2 n0 n1 n2
python3 - <<'PY'
import random
open("pat", "wb").write(random.Random(5).randbytes(4 << 20))
open("pat2", "wb").write(random.Random(6).randbytes(1 << 20))
PY
want="$(sha256sum pat | cut -d' ' -f1)"
"$URAID" create -l5 -c 64K --consistency-policy ppl n0 n1 n2 2>/dev/null
"$URAID" write --input pat n0 n1 n2
cat > job.sh <<JOB
mdadm --create /dev/md0 --run --metadata=1.2 -l5 -n3 -c 64 --consistency-policy=ppl \
    --assume-clean /dev/disk/2 /dev/disk/3 /dev/disk/4 2>&1
echo "md0 policy=\$(cat /sys/block/md0/md/consistency_policy)"
dd if=/dev/disk/1 of=/dev/md0 bs=65536 count=64 conv=fsync 2>/dev/null
mdadm --stop /dev/md0
mdadm --assemble --run /dev/md1 /dev/disk/5 /dev/disk/6 /dev/disk/7 2>&1
echo "md1 policy=\$(cat /sys/block/md1/md/consistency_policy)"
echo "md1 sync_action=\$(cat /sys/block/md1/md/sync_action)"
grep -A3 '^md1' /proc/mdstat
echo "md1 sha=\$(head -c $LEN /dev/md1 | sha256sum | cut -d' ' -f1)"
echo check >/sys/block/md1/md/sync_action; sleep 0.5
mdadm --wait /dev/md1 >/dev/null 2>&1
while [ "\$(cat /sys/block/md1/md/sync_action)" != idle ]; do sleep 0.2; done
echo "md1 mismatch_cnt=\$(cat /sys/block/md1/md/mismatch_cnt)"
mdadm --stop /dev/md1
echo GUEST-OK
JOB
out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job.sh --disk pat \
    --disk m0 --disk m1 --disk m2 --disk n0 --disk n1 --disk n2 2>&1)" || true
grep -q GUEST-OK <<<"$out" || { echo "FAIL ppl boot 1: $out" | tail -30; exit 1; }
fail() { echo "FAIL ppl $1"; echo "$out" | tail -30; exit 1; }
grep -q "md0 policy=ppl" <<<"$out" || fail "linux create: no ppl policy"
got="$("$URAID" read --length $LEN m2 m1 m0 | sha256sum | cut -d' ' -f1)"
[ "$got" = "$want" ] || fail "linux->uraid: sha256 $got, want $want"
"$URAID" detail m0 m1 m2 | grep -q "Consistency Policy : ppl" || fail "linux->uraid: detail policy"
"$URAID" examine m0 | grep -q "PPL : 2048 sectors at offset 8 sectors from superblock" ||
    fail "linux->uraid: examine PPL line: $("$URAID" examine m0)"
"$URAID" check -q m0 m1 m2 | grep -q "mismatch_cnt: 0" || fail "linux->uraid: parity mismatch"
echo "PASS ppl linux->uraid: uraid read md's PPL raid5 (same sha256), policy ppl, parity consistent"
grep -q "md1 policy=ppl" <<<"$out" || fail "uraid->linux: md policy not ppl"
grep -q "md1 sync_action=idle" <<<"$out" || fail "uraid->linux: md started a resync"
grep -A3 '^md1' <<<"$out" | grep -q "resync\|recovery" && fail "uraid->linux: resync in mdstat"
grep -q "md1 sha=$want" <<<"$out" || fail "uraid->linux: sha256 differs"
grep -q "md1 mismatch_cnt=0" <<<"$out" || fail "uraid->linux: md check found mismatches"
echo "PASS ppl uraid->linux: md assembled uraid's PPL raid5 clean, same sha256, check 0 mismatches"

# 3. md crashed mid-write: an acknowledged 1 MiB at 1 MiB + 4 KiB (not stripe aligned, so
#    md logs partial parity), then unacknowledged writes in flight when the VM dies.
cat > job2.sh <<'JOB'
mdadm --assemble --run /dev/md0 /dev/disk/2 /dev/disk/3 /dev/disk/4 2>&1
dd if=/dev/disk/1 of=/dev/md0 bs=4096 seek=257 count=256 conv=fsync 2>/dev/null
echo ACKED
(while :; do dd if=/dev/disk/1 of=/dev/md0 bs=4096 skip=7 seek=601 count=64 conv=fsync 2>/dev/null; done) &
sleep 1
grep -A3 '^md0' /proc/mdstat
echo GUEST-OK
echo b > /proc/sysrq-trigger
JOB
out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job2.sh --disk pat2 \
    --disk m0 --disk m1 --disk m2 2>&1)" || true
grep -q ACKED <<<"$out" && grep -q GUEST-OK <<<"$out" || fail "md crash: guest did not write"
"$URAID" examine m0 | grep -q "State : active" || fail "md crash: the array was left clean"
"$URAID" read --offset $((257 * 4096)) --length $((1 << 20)) m0 m1 m2 2>recover.err >back ||
    { cat recover.err; fail "md crash: uraid could not assemble"; }
cmp -s back pat2 || fail "md crash: the acknowledged write did not read back"
"$URAID" check -q m0 m1 m2 | grep -q "mismatch_cnt: 0" || fail "md crash: parity mismatch after PPL recovery"
echo "PASS ppl md crash->uraid: PPL recovery, acknowledged write intact, parity consistent"

# 4. uraid killed (SIGKILL) mid-write: md assembles the dirty array, its PPL recovery runs,
#    and md's check finds parity consistent.
# The input comes slowly (256 KiB every 20 ms, 20 MiB in all), so the writer is still
# writing when it is killed: the kill comes once the superblock says the array is active,
# whatever the machine's speed.
( for _ in $(seq 80); do head -c 262144 /dev/urandom; sleep 0.02; done ) |
    "$URAID" write n0 n1 n2 2>/dev/null &
pid=$!
i=0
until "$URAID" examine n0 2>/dev/null | grep -q "State : active"; do
    i=$((i + 1))
    [ "$i" -lt 400 ] || break
    sleep 0.01
done
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
"$URAID" examine n0 | grep -q "State : active" ||
    { out=""; fail "uraid crash: the write finished before the kill (array clean); nothing tested"; }
cat > job3.sh <<'JOB'
mdadm --assemble --run /dev/md0 /dev/disk/1 /dev/disk/2 /dev/disk/3 2>&1
dmesg | grep -i ppl
echo "sync_action=$(cat /sys/block/md0/md/sync_action)"
mdadm --wait /dev/md0 >/dev/null 2>&1
while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
echo check >/sys/block/md0/md/sync_action; sleep 0.5
mdadm --wait /dev/md0 >/dev/null 2>&1
while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
echo "mismatch_cnt=$(cat /sys/block/md0/md/mismatch_cnt)"
mdadm --stop /dev/md0
echo GUEST-OK
JOB
out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job3.sh --disk n0 --disk n1 --disk n2 2>&1)" || true
grep -q GUEST-OK <<<"$out" || fail "uraid crash: md did not assemble"
grep -q "mismatch_cnt=0" <<<"$out" || fail "uraid crash: md check found mismatches"
echo "PASS ppl uraid crash->linux: md assembled the dirty PPL array ($(grep -m1 sync_action= <<<"$out")), check 0 mismatches"
grep -i "ppl" <<<"$out" | head -5 || true  # md's PPL messages, if any: informational
