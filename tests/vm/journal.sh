#!/usr/bin/env bash
# The raid5 write journal (md's raid5-cache) both ways, in one VM boot (project issue 8):
# uraid creates a raid5 with --write-journal and writes a pattern; Linux md must assemble it
# with its journal ("1 journal", consistency policy journal) and read the same bytes; Linux
# writes through the journal and stops; uraid must load Linux's journal and read that write,
# with parity consistent (check finds 0 mismatches).
#
#   tests/vm/journal.sh            (URAID=path/to/uraid to pick the binary)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
URAID="${URAID:-$ROOT/target/debug/uraid}"
"$HERE/setup.sh" >/dev/null
W="$(mktemp -d "${TMPDIR:-/tmp}/uraid-journal-vm.XXXXXX")"
trap 'rm -rf "$W"' EXIT
cd "$W"
truncate -s 32M m0 m1 m2 m3 j
"$URAID" create -l5 -c 64K --write-journal j m0 m1 m2 m3 2>/dev/null
python3 - <<'PY'
import random
r = random.Random(8)
open("pat", "wb").write(bytes(r.getrandbits(8) for _ in range(4 << 20)))
PY
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
echo GUEST-OK
JOB
if ! out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job.sh --disk m0 --disk m1 --disk m2 --disk m3 --disk j 2>&1)"; then
    echo "FAIL journal u2l: $out" | tail -20
    exit 1
fi
grep -q GUEST-OK <<<"$out" || { echo "FAIL journal u2l: $out" | tail -20; exit 1; }
echo "PASS journal uraid->linux: md assembled uraid's journal array, same sha256"
back="$("$URAID" read --offset 409600 --length 16 m0 m1 m2 m3 j)"
[ "$back" = "linux-wrote-this" ] || { echo "FAIL journal linux->uraid: read '$back'"; exit 1; }
"$URAID" check -q m0 m1 m2 m3 j | grep -q "mismatch_cnt: 0" || { echo "FAIL journal: parity mismatch"; exit 1; }
echo "PASS journal linux->uraid: uraid loaded md's journal and read Linux's write, parity consistent"
