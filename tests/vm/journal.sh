#!/usr/bin/env bash
# The raid5 write journal (md's raid5-cache) both ways, in one VM boot (project issue 8):
# uraid creates a raid5 with --write-journal and writes a pattern; Linux md must assemble it
# with its journal ("1 journal", consistency policy journal) and read the same bytes; Linux
# writes through the journal and stops; uraid must load Linux's journal and read that write,
# with parity consistent (check finds 0 mismatches).
# Write-back, in the same boot and a second one: uraid writes a partial stripe in write-back
# mode and exits like a crash (data-only records in the journal, nothing written out); md
# must replay it (same sha256, check finds 0 mismatches). Then md writes in write-back mode
# and the VM is crashed (sysrq b); uraid must replay md's journal and read that write.
#
#   tests/vm/journal.sh            (URAID=path/to/uraid to pick the binary)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
URAID="${URAID:-$ROOT/target/debug/uraid}"
"$HERE/setup.sh" >/dev/null
. "$HERE/scratch.sh"
W="$(vm_scratch journal-vm 400)"
trap 'rm -rf "$W"' EXIT
cd "$W"
truncate -s 32M m0 m1 m2 m3 j n0 n1 n2 n3 k
"$URAID" create -l5 -c 64K --write-journal j m0 m1 m2 m3 2>/dev/null
"$URAID" create -l5 -c 64K --write-journal k n0 n1 n2 n3 2>/dev/null
python3 - <<'PY'
import random
r = random.Random(8)
pat = bytes(r.getrandbits(8) for _ in range(4 << 20))
open("pat", "wb").write(pat)
# Write-back: 100 KiB at 12 KiB, inside one 192 KiB stripe (cached, not written out).
r = random.Random(9)
small = bytes(r.getrandbits(8) for _ in range(100 << 10))
open("small", "wb").write(small)
import hashlib
model = bytearray(pat)
model[12288:12288 + len(small)] = small
open("want-wb", "w").write(hashlib.sha256(model).hexdigest())
PY
"$URAID" write --input pat n0 n1 n2 n3 k
"$URAID" write --journal-mode write-back --crash-after --offset 12288 --input small \
    n0 n1 n2 n3 k 2>wb.err
grep -q "[1-9][0-9]* pages left in the write-back cache" wb.err || {
    echo "FAIL journal write-back: uraid left nothing cached: $(cat wb.err)"; exit 1; }
want_wb="$(cat want-wb)"
"$URAID" write --input pat m0 m1 m2 m3 j
want="$("$URAID" read --length $((4 << 20)) m0 m1 m2 m3 j | sha256sum | cut -d' ' -f1)"
cat > job.sh <<JOB
set -e
mdadm --assemble --run /dev/md0 /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4 /dev/disk/5 2>&1
grep -q '(J)' /proc/mdstat || { echo "NO-JOURNAL"; cat /proc/mdstat; exit 1; }
mdadm --detail /dev/md0 | grep -q 'Consistency Policy : journal' || { echo "NO-POLICY"; exit 1; }
got=\$(head -c $((4 << 20)) /dev/md0 | sha256sum | cut -d' ' -f1)
[ "\$got" = "$want" ] || { echo "SUM-MISMATCH \$got"; exit 1; }
echo linux-wrote-this | dd of=/dev/md0 bs=4096 seek=100 conv=sync,fsync 2>/dev/null
mdadm --stop /dev/md0
mdadm --assemble --run /dev/md1 /dev/disk/6 /dev/disk/7 /dev/disk/8 /dev/disk/9 /dev/disk/10 2>&1
got=\$(head -c $((4 << 20)) /dev/md1 | sha256sum | cut -d' ' -f1)
[ "\$got" = "$want_wb" ] || { echo "WB-SUM-MISMATCH \$got"; exit 1; }
# md may be busy right after assembly (finishing its journal recovery): wait for idle.
echo "md1 after assembly: \$(cat /sys/block/md1/md/sync_action); \$(grep -A2 '^md1' /proc/mdstat | tr '\n' ' ')"
mdadm --wait /dev/md1 >/dev/null 2>&1 || true
while [ "\$(cat /sys/block/md1/md/sync_action)" != idle ]; do sleep 0.2; done
echo check > /sys/block/md1/md/sync_action
mdadm --wait /dev/md1 >/dev/null 2>&1 || true
while [ "\$(cat /sys/block/md1/md/sync_action)" != idle ]; do sleep 0.2; done
mm=\$(cat /sys/block/md1/md/mismatch_cnt)
[ "\$mm" = 0 ] || { echo "WB-MISMATCH \$mm"; exit 1; }
mdadm --stop /dev/md1
echo GUEST-OK
JOB
if ! out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job.sh --disk m0 --disk m1 --disk m2 --disk m3 --disk j \
        --disk n0 --disk n1 --disk n2 --disk n3 --disk k 2>&1)"; then
    echo "FAIL journal u2l: $out" | tail -20
    exit 1
fi
grep -q GUEST-OK <<<"$out" || { echo "FAIL journal u2l: $out" | tail -20; exit 1; }
echo "PASS journal uraid->linux: md assembled uraid's journal array, same sha256"
back="$("$URAID" read --offset 409600 --length 16 m0 m1 m2 m3 j)"
[ "$back" = "linux-wrote-this" ] || { echo "FAIL journal linux->uraid: read '$back'"; exit 1; }
"$URAID" check -q m0 m1 m2 m3 j | grep -q "mismatch_cnt: 0" || { echo "FAIL journal: parity mismatch"; exit 1; }
echo "PASS journal linux->uraid: uraid loaded md's journal and read Linux's write, parity consistent"
echo "PASS journal write-back uraid->linux: md replayed uraid's write-back log, same sha256, parity consistent ($(grep -m1 'md1 after assembly' <<<"$out"))"

# md in write-back mode, crashed before its reclaim: uraid replays md's journal.
cat > job2.sh <<'JOB'
set -e
mdadm --assemble --run /dev/md0 /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4 /dev/disk/5 2>&1
echo write-back > /sys/block/md0/md/journal_mode
cat /sys/block/md0/md/journal_mode
echo linux-wb-wrote-this | dd of=/dev/md0 bs=4096 seek=300 conv=sync,fsync 2>/dev/null
echo GUEST-OK
sync
echo b > /proc/sysrq-trigger
JOB
# The guest never finishes its job (it is crashed on purpose): only its log counts.
out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job2.sh --disk n0 --disk n1 --disk n2 --disk n3 --disk k 2>&1)" || true
grep -q '\[write-back\]' <<<"$out" && grep -q GUEST-OK <<<"$out" || {
    echo "FAIL journal md write-back: $out" | tail -20; exit 1; }
back="$("$URAID" read --offset $((300 * 4096)) --length 19 n0 n1 n2 n3 k 2>replay.err)"
[ "$back" = "linux-wb-wrote-this" ] || {
    echo "FAIL journal linux write-back->uraid: read '$back'"; cat replay.err; exit 1; }
"$URAID" check -q n0 n1 n2 n3 k | grep -q "mismatch_cnt: 0" || { echo "FAIL journal write-back: parity mismatch"; exit 1; }
echo "PASS journal write-back linux->uraid: uraid replayed md's write-back journal and read Linux's write"
