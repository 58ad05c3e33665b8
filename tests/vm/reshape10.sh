#!/usr/bin/env bash
# A raid10 stopped by Linux md in the middle of a reshape (issues 12 and 15): in one VM boot,
# mdadm creates a 1.2 raid10 near=2 on 4 members with an internal bitmap, fills it from the pattern disk and records
# its sha256, adds a spare and grows to 5 members (md's raid10 reshape always moves the data
# offset: FEATURE_NEW_OFFSET) with the resync speed held low; once sync_completed is past 0
# and short of the end the reshape is frozen and the array stopped. On the host, uraid
# examine must show mdadm's reshape position, uraid read must give the sha256 Linux
# recorded, uraid grow --continue must finish it (5 devices, the same bytes, every copy
# equal); in a second boot Linux md assembles the result with no reshape left, `echo check`
# finds 0 mismatches and the sha256 reads back. The other way, in the same second boot:
# uraid grows a raid10 of its own 4 -> 5 and stops mid-way (--stop-at); Linux md assembles
# it, finishes the reshape, and finds 0 mismatches and the sha256 uraid wrote. And served:
# uraid grows a served raid10 4 -> 5 (the reshape run by the server) while qemu-io writes
# through NBD, is stopped, and Linux md finishes it (0 mismatches, the bytes uraid served).
# Linux's grow and shrink and uraid's shrink carry an internal bitmap (md keeps it at the old
# size while the reshape runs and resizes it at the end; uraid finishes with it resized). And
# shrinks both ways: Linux shrinks a raid10 4 -> 3 (--array-size, then --raid-devices;
# backwards, the data offset moving up) and is stopped, uraid reads and finishes it and
# Linux checks the result; uraid shrinks one of its own 4 -> 3 keeping 40M (the component
# size lowered to make room after the data), stops mid-way, and Linux md finishes it.
#
#   tests/vm/reshape10.sh          (URAID=path/to/uraid to pick the binary)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
URAID="${URAID:-$ROOT/target/debug/uraid}"
"$HERE/setup.sh" >/dev/null
. "$HERE/scratch.sh"
W="$(vm_scratch reshape10-vm 800)"
# RESHAPE_KEEP=1 keeps the member images (the folder is printed) to look at by hand.
if [ -n "${RESHAPE_KEEP:-}" ]; then echo "images in $W"; else trap 'rm -rf "$W"' EXIT; fi
cd "$W"
truncate -s 32M r0 r1 r2 r3 r4 l0 l1 l2 l3
cat > job.sh <<'JOB'
set -e
echo 200 > /proc/sys/dev/raid/speed_limit_min
echo 200 > /proc/sys/dev/raid/speed_limit_max
sum_of() { # MD: sha256 of the whole array, after dropping caches
    sync; echo 3 > /proc/sys/vm/drop_caches
    sha256sum /dev/$1 | cut -d' ' -f1
}
freeze_mid() { # MD: hold the reshape slow, freeze it once it is past 0 and short of the
               # end, say where, and stop the array
    echo 200 > /sys/block/$1/md/sync_speed_min
    echo 200 > /sys/block/$1/md/sync_speed_max
    i=0
    while :; do
        sc="$(cat /sys/block/$1/md/sync_completed)"
        case "$sc" in
        none|"0 / "*) ;;
        *) d="${sc%% /*}"; t="${sc##*/ }"; [ "$d" -gt 0 ] && [ "$d" -lt "$t" ] && break ;;
        esac
        i=$((i + 1)); [ $i -lt 600 ] || { echo "NO-PROGRESS $sc"; cat /proc/mdstat; exit 1; }
        sleep 0.2
    done
    echo frozen > /sys/block/$1/md/sync_action
    echo "$1 at sync_completed $(cat /sys/block/$1/md/sync_completed) reshape_position $(cat /sys/block/$1/md/reshape_position)"
    cat /proc/mdstat
    mdadm --stop /dev/$1 2>&1
}
mdadm --create --run /dev/md0 --metadata=1.2 --level=10 --layout=n2 --chunk=64 \
    --bitmap=internal --bitmap-chunk=64K \
    --raid-devices=4 --assume-clean /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4 2>&1
n=$(cat /sys/block/md0/size)
dd if=/dev/disk/0 of=/dev/md0 bs=512 count=$n conv=fsync 2>/dev/null
echo "SUM-R $(sum_of md0) $n"
mdadm /dev/md0 --add /dev/disk/5 2>&1
if ! mdadm --grow /dev/md0 --raid-devices=5 2>&1; then
    echo "GROW-REFUSED"; mdadm --examine /dev/disk/1; echo GUEST-OK; exit 0
fi
freeze_mid md0
mdadm --examine /dev/disk/1 | grep -E "Reshape|Delta|Offset|Layout|Raid Devices" || true
# Linux shrinks a raid10 4 -> 3 (md's backwards reshape, the data offset moving up into the
# room --size left after the data) and is stopped mid-way.
mdadm --create --run /dev/md5 --metadata=1.2 --level=10 --layout=n2 --chunk=64 --size=24M \
    --bitmap=internal --bitmap-chunk=64K \
    --raid-devices=4 --assume-clean /dev/disk/6 /dev/disk/7 /dev/disk/8 /dev/disk/9 2>&1
n=$(cat /sys/block/md5/size)
dd if=/dev/disk/0 of=/dev/md5 bs=512 count=$n conv=fsync 2>/dev/null
keep=$((36 * 2048))
sync; echo 3 > /proc/sys/vm/drop_caches
echo "SUM-S $(head -c $((keep * 512)) /dev/md5 | sha256sum | cut -d' ' -f1) $keep"
if mdadm --grow /dev/md5 --array-size=36M 2>&1 && mdadm --grow /dev/md5 --raid-devices=3 2>&1; then
    freeze_mid md5
else
    echo "SHRINK-REFUSED"
    mdadm --stop /dev/md5 2>&1
fi
echo GUEST-OK
JOB
rc=0
out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job.sh --boot-timeout 900 \
    --disk r0 --disk r1 --disk r2 --disk r3 --disk r4 --disk l0 --disk l1 --disk l2 --disk l3 2>&1)" || rc=$?
if [ $rc != 0 ] || ! grep -q GUEST-OK <<<"$out"; then
    echo "FAIL reshape10 (guest, rc $rc):"; tail -40 <<<"$out"; exit 1
fi
if grep -q GROW-REFUSED <<<"$out"; then
    echo "FAIL reshape10: mdadm refused to grow the raid10:"; grep -v '^SUM' <<<"$out" | tail -30; exit 1
fi
grep -E "^md[05] at |^mdadm: |Reshape|New Offset|Delta" <<<"$out" | sed 's/^/  guest: /' || true
sum="$(grep -m1 "^SUM-R " <<<"$out" | cut -d' ' -f2)"
sectors="$(grep -m1 "^SUM-R " <<<"$out" | cut -d' ' -f3)"
md_pos="$(mdadm --examine r0 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')"
u_pos="$("$URAID" examine r0 2>&1 | grep "Reshape pos'n" | sed 's/.*: *//')" || true
if [ -z "$md_pos" ] || [ "$md_pos" != "$u_pos" ]; then
    echo "FAIL reshape10: mdadm --examine says reshape at '$md_pos', uraid examine '$u_pos'"
    mdadm --examine r0; exit 1
fi
got="$("$URAID" read r4 r3 r2 r1 r0 2>r.err | sha256sum | cut -d' ' -f1)"
if [ "$got" != "$sum" ]; then
    echo "FAIL reshape10: uraid read $got of Linux's stopped raid10 grow at $md_pos, Linux recorded $sum"
    cat r.err; exit 1
fi
echo "PASS reshape10 read: stopped at $md_pos, uraid read the sha256 Linux recorded before the grow"
prefix_sum() { # BYTES MEMBERS...: sha256 of the array's first BYTES
    local n=$1; shift
    "$URAID" read --length "$n" "$@" | sha256sum | cut -d' ' -f1
}
if ! "$URAID" grow -q --continue r0 r1 r2 r3 r4 >cont.log 2>&1; then
    echo "FAIL reshape10 continue: uraid grow --continue failed"; cat cont.log; exit 1
fi
disks="$("$URAID" detail --json r0 r1 r2 r3 r4 | python3 -c 'import json,sys; print(json.load(sys.stdin)["raid_disks"])')"
if [ "$disks" != 5 ] || [ "$(prefix_sum $((sectors * 512)) r0 r1 r2 r3 r4)" != "$sum" ] ||
    ! "$URAID" check -q r0 r1 r2 r3 r4 | grep -q "mismatch_cnt: 0"; then
    echo "FAIL reshape10 continue: after uraid finished Linux's grow: $disks devices, or bytes/copies differ"
    cat cont.log; exit 1
fi
# The internal bitmap (counting array sectors) covers the grown array, as md resizes it.
# (mdadm -X reads an image file as an array, not a member, so its sync_size is read here.)
bitmap_sync() { # MEMBER: its internal bitmap's sync_size in sectors, or "none"
    python3 - "$1" <<'PY'
import re, struct, subprocess, sys
ex = subprocess.run(["mdadm", "--examine", sys.argv[1]], capture_output=True, text=True).stdout
so = re.search(r"Super Offset : (\d+)", ex)
bo = re.search(r"Internal Bitmap : (-?\d+)", ex)
if not so or not bo:
    sys.exit(print("none"))
with open(sys.argv[1], "rb") as f:
    f.seek((int(so.group(1)) + int(bo.group(1))) * 512)
    b = f.read(256)
print(struct.unpack_from("<Q", b, 40)[0] if b[:4] == b"bitm" else "none")
PY
}
bm_s="$(bitmap_sync r0)"
r_s="$(( $("$URAID" detail --json r0 r1 r2 r3 r4 | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])') / 512 ))"
if [ "$bm_s" != "$r_s" ]; then
    echo "FAIL reshape10 continue: the bitmap covers $bm_s sectors of the $r_s-sector array after the grow"
    mdadm --examine r0; exit 1
fi
echo "PASS reshape10 continue: uraid finished Linux md's raid10 grow with its internal bitmap (5 devices, the sha256, every copy equal, the bitmap resized to $bm_s sectors)"
# Linux -> uraid, a shrink: Linux md's raid10 4 -> 3 (backwards, the data offset moving up),
# stopped mid-way: uraid reads the bytes it keeps and finishes it; Linux md checks the result
# in the second boot.
if grep -q SHRINK-REFUSED <<<"$out"; then
    echo "FAIL reshape10 linux-shrink: mdadm refused to shrink the raid10:"; grep -v '^SUM' <<<"$out" | tail -30; exit 1
fi
s_sum="$(grep -m1 "^SUM-S " <<<"$out" | cut -d' ' -f2)"
s_keep="$(grep -m1 "^SUM-S " <<<"$out" | cut -d' ' -f3)"
l_pos="$(mdadm --examine l0 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')"
u_pos="$("$URAID" examine l0 2>&1 | grep "Reshape pos'n" | sed 's/.*: *//')" || true
if [ -z "$l_pos" ] || [ "$l_pos" != "$u_pos" ] ||
    ! mdadm --examine l0 | grep -q "Delta Devices : -1"; then
    echo "FAIL reshape10 linux-shrink: mdadm --examine says '$l_pos' (a shrink?), uraid examine '$u_pos'"
    mdadm --examine l0; exit 1
fi
if [ "$(prefix_sum $((s_keep * 512)) l0 l1 l2 l3)" != "$s_sum" ]; then
    echo "FAIL reshape10 linux-shrink: uraid read other bytes of Linux's stopped raid10 shrink at $l_pos"; exit 1
fi
if ! "$URAID" grow -q --continue l0 l1 l2 l3 >cont-l.log 2>&1; then
    echo "FAIL reshape10 linux-shrink: uraid grow --continue failed"; cat cont-l.log; exit 1
fi
disks="$("$URAID" detail --json l0 l1 l2 l3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["raid_disks"])')"
if [ "$disks" != 3 ] || [ "$(prefix_sum $((s_keep * 512)) l0 l1 l2 l3)" != "$s_sum" ] ||
    ! "$URAID" check -q l0 l1 l2 l3 | grep -q "mismatch_cnt: 0"; then
    echo "FAIL reshape10 linux-shrink: after uraid finished Linux's shrink: $disks devices, or bytes/copies differ"
    cat cont-l.log; exit 1
fi
l_bm="$(bitmap_sync l0)"
l_s="$(( $("$URAID" detail --json l0 l1 l2 l3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])') / 512 ))"
if [ "$l_bm" != "$l_s" ]; then
    echo "FAIL reshape10 linux-shrink: the bitmap covers $l_bm sectors of the $l_s-sector array after the shrink"; exit 1
fi
echo "PASS reshape10 linux-shrink: Linux md's raid10 4 -> 3 with an internal bitmap stopped at $l_pos (backwards); uraid read the bytes it keeps and finished it (3 devices, the sha256, every copy equal, the bitmap resized to $l_s sectors)"
# uraid -> Linux, a shrink: uraid shrinks a raid10 of its own 4 -> 3 keeping 40M (the
# component size lowered to make room after the data) and stops mid-way; Linux md finishes it.
truncate -s 32M z0 z1 z2 z3
"$URAID" create -l 10 -p n2 -c 64K -n 4 --bitmap internal --bitmap-chunk 64K --assume-clean \
    z0 z1 z2 z3 >/dev/null 2>&1
sz=$((40 << 20))
head -c "$sz" /dev/urandom > pat-z
"$URAID" write --input pat-z z0 z1 z2 z3 >/dev/null
sum_z="$(sha256sum < pat-z | cut -d' ' -f1)"
"$URAID" grow -q -n 3 --array-size 40M --stop-at 40000 -- z0 z1 z2 z3 >grow-z.log 2>&1 ||
    { echo "FAIL reshape10 uraid shrink-4to3: uraid grow failed"; cat grow-z.log; exit 1; }
z_pos="$(mdadm --examine z0 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')"
if [ -z "$z_pos" ] || [ "$(prefix_sum "$sz" z0 z1 z2 z3)" != "$sum_z" ]; then
    echo "FAIL reshape10 uraid shrink-4to3: mdadm --examine shows no reshape ('$z_pos') or uraid reads other bytes"
    mdadm --examine z0; cat grow-z.log; exit 1
fi
# uraid -> Linux: uraid starts a raid10 grow 4 -> 5 of its own and stops it mid-way; Linux md
# goes on with it in the second boot.
truncate -s 32M x0 x1 x2 x3 x4
"$URAID" create -l 10 -p n2 -c 64K -n 4 --assume-clean x0 x1 x2 x3 >/dev/null 2>&1
sx="$("$URAID" detail --json x0 x1 x2 x3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])')"
head -c "$sx" /dev/urandom > pat-x
"$URAID" write --input pat-x x0 x1 x2 x3 >/dev/null
sum_x="$(sha256sum < pat-x | cut -d' ' -f1)"
"$URAID" grow -q -n 5 --add x4 --stop-at 30000 -- x0 x1 x2 x3 >grow-x.log 2>&1 ||
    { echo "FAIL reshape10 uraid grow-4to5: uraid grow failed"; cat grow-x.log; exit 1; }
x_pos="$(mdadm --examine x0 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')"
if [ -z "$x_pos" ] || [ "$(prefix_sum "$sx" x0 x1 x2 x3 x4)" != "$sum_x" ]; then
    echo "FAIL reshape10 uraid grow-4to5: mdadm --examine shows no reshape ('$x_pos') or uraid reads other bytes"
    mdadm --examine x0; cat grow-x.log; exit 1
fi
# uraid -> Linux, served (issue 15): uraid serves a raid10 of its own, grows it 4 -> 5 through
# the control socket (the reshape run by the server, its speed held low), qemu-io writes
# through NBD below and above the moving position while it runs, and the server is stopped
# (the position recorded); Linux md assembles it in the second boot, finishes what is left,
# and finds 0 mismatches and the bytes uraid served.
truncate -s 32M y0 y1 y2 y3 y4
"$URAID" create -l 10 -p n2 -c 64K -n 4 --assume-clean y0 y1 y2 y3 >/dev/null 2>&1
sy="$("$URAID" detail --json y0 y1 y2 y3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])')"
head -c "$sy" /dev/urandom > pat-y
"$URAID" write --input pat-y y0 y1 y2 y3 >/dev/null
"$URAID" serve --name md0 --nbd "unix:$W/y.sock" --control "$W/y.ctl" --speed-max 3000 \
    y0 y1 y2 y3 >serve-y.log 2>&1 &
ypid=$!
for _ in $(seq 600); do [ -S "$W/y.ctl" ] && break; sleep 0.1; done
if ! "$URAID" grow -q --control "$W/y.ctl" -n 5 --add "$W/y4" >grow-y.log 2>&1; then
    echo "FAIL reshape10 served grow-4to5: uraid grow failed"; cat grow-y.log serve-y.log; kill $ypid; exit 1
fi
sleep 2
for at in 1 24; do
    qemu-io -f raw -c "write -P 0x5a ${at}M 2M" "nbd+unix:///md0?socket=$W/y.sock" >/dev/null ||
        { echo "FAIL reshape10 served grow-4to5: qemu-io write at ${at}M"; cat serve-y.log; kill $ypid; exit 1; }
    python3 -c "
import sys; f=open('pat-y','r+b'); f.seek($at<<20); f.write(b'\x5a'*(2<<20))"
done
ydone="$("$URAID" detail --json --control "$W/y.ctl" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("raid_disks"), d.get("sync_action", ""))')"
"$URAID" stop --control "$W/y.ctl" >/dev/null 2>&1 || { echo "FAIL reshape10 served grow-4to5: uraid stop"; cat serve-y.log; exit 1; }
wait $ypid || true
sum_y="$(head -c "$sy" pat-y | sha256sum | cut -d' ' -f1)"
y_pos="$(mdadm --examine y0 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')" || true
if [ "$(prefix_sum "$sy" y0 y1 y2 y3 y4)" != "$sum_y" ]; then
    echo "FAIL reshape10 served grow-4to5: uraid reads other bytes than it served ($ydone)"; cat serve-y.log; exit 1
fi
cat > job2.sh <<JOB
set -e
finish() { # MD TAG BYTES DEVICES...: assemble, let md finish what reshape is left, check it,
           # print "MD at-assembly ...", "TAG disks=N mismatch_cnt=M" and "TAGSUM sha256"
    local md=\$1 tag=\$2 bytes=\$3; shift 3
    mdadm --assemble --run /dev/\$md "\$@" 2>&1
    echo "\$md at-assembly reshape_position=\$(cat /sys/block/\$md/md/reshape_position) disks=\$(cat /sys/block/\$md/md/raid_disks)"
    mdadm --wait /dev/\$md >/dev/null 2>&1 || true
    while [ "\$(cat /sys/block/\$md/md/sync_action)" != idle ] ||
          [ "\$(cat /sys/block/\$md/md/reshape_position)" != none ]; do sleep 0.5; done
    echo check > /sys/block/\$md/md/sync_action; sleep 0.5
    mdadm --wait /dev/\$md >/dev/null 2>&1 || true
    while [ "\$(cat /sys/block/\$md/md/sync_action)" != idle ]; do sleep 0.2; done
    echo "\$tag disks=\$(cat /sys/block/\$md/md/raid_disks) mismatch_cnt=\$(cat /sys/block/\$md/md/mismatch_cnt)"
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "\${tag}SUM \$(head -c \$bytes /dev/\$md | sha256sum | cut -d' ' -f1)"
    mdadm --stop /dev/\$md
}
finish md2 Y $sy /dev/disk/11 /dev/disk/12 /dev/disk/13 /dev/disk/14 /dev/disk/15
finish md1 X $sx /dev/disk/6 /dev/disk/7 /dev/disk/8 /dev/disk/9 /dev/disk/10
finish md0 R $((sectors * 512)) /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4 /dev/disk/5
finish md3 L $((s_keep * 512)) /dev/disk/16 /dev/disk/17 /dev/disk/18 /dev/disk/19
finish md4 Z $sz /dev/disk/20 /dev/disk/21 /dev/disk/22 /dev/disk/23
echo GUEST-OK
JOB
rc=0
out2="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job2.sh --boot-timeout 900 \
    --disk r0 --disk r1 --disk r2 --disk r3 --disk r4 \
    --disk x0 --disk x1 --disk x2 --disk x3 --disk x4 \
    --disk y0 --disk y1 --disk y2 --disk y3 --disk y4 \
    --disk l0 --disk l1 --disk l2 --disk l3 --disk z0 --disk z1 --disk z2 --disk z3 2>&1)" || rc=$?
if [ $rc != 0 ] || ! grep -q GUEST-OK <<<"$out2"; then
    echo "FAIL reshape10 read by linux (guest, rc $rc):"; tail -40 <<<"$out2"; exit 1
fi
if ! grep -q "^md0 at-assembly reshape_position=none disks=5" <<<"$out2" ||
    ! grep -q "^R disks=5 mismatch_cnt=0$" <<<"$out2" || [ "$(grep -m1 "^RSUM " <<<"$out2" | cut -d' ' -f2)" != "$sum" ]; then
    echo "FAIL reshape10 read by linux:"; tail -30 <<<"$out2"; exit 1
fi
echo "PASS reshape10 finished by uraid, read by linux (5 devices, no reshape left, check 0 mismatches, the sha256)"
x_at="$(grep -m1 "^md1 at-assembly " <<<"$out2" | sed 's/.*reshape_position=//; s/ .*//')"
if [ -z "$x_at" ] || [ "$x_at" = none ] || ! grep -q "^X disks=5 mismatch_cnt=0$" <<<"$out2" ||
    [ "$(grep -m1 "^XSUM " <<<"$out2" | cut -d' ' -f2)" != "$sum_x" ]; then
    echo "FAIL reshape10 uraid grow-4to5 finished by linux (md found the reshape at '$x_at'):"; tail -30 <<<"$out2"; exit 1
fi
echo "PASS reshape10 uraid grow-4to5 finished by linux (uraid stopped at $x_pos, md assembled it at reshape_position $x_at and finished: 5 devices, check 0 mismatches, the sha256)"
if ! grep -q "^Y disks=5 mismatch_cnt=0$" <<<"$out2" ||
    [ "$(grep -m1 "^YSUM " <<<"$out2" | cut -d' ' -f2)" != "$sum_y" ]; then
    echo "FAIL reshape10 served grow-4to5 read by linux (uraid stopped it at '$y_pos'):"; tail -30 <<<"$out2"; exit 1
fi
y_at="$(grep -m1 "^md2 at-assembly " <<<"$out2" | sed 's/.*reshape_position=//; s/ .*//')"
if [ -n "$y_pos" ]; then y_where="mid-way at $y_pos"; else y_where="after the reshape ended"; fi
echo "PASS reshape10 served grow-4to5: uraid grew its raid10 while serving it and qemu-io wrote through NBD at 1M and 24M meanwhile; stopped $y_where, Linux md assembled it (reshape_position $y_at) and finished: 5 devices, check 0 mismatches, the bytes uraid served"
l_at="$(grep -m1 "^md3 at-assembly " <<<"$out2" | sed 's/.*reshape_position=//')"
if ! grep -q "^L disks=3 mismatch_cnt=0$" <<<"$out2" ||
    [ "$(grep -m1 "^LSUM " <<<"$out2" | cut -d' ' -f2)" != "$s_sum" ]; then
    echo "FAIL reshape10 linux-shrink read by linux (md assembled it at '$l_at'):"; tail -30 <<<"$out2"; exit 1
fi
echo "PASS reshape10 linux-shrink read by linux (assembled at reshape_position $l_at: 3 devices, check 0 mismatches, the sha256)"
z_at="$(grep -m1 "^md4 at-assembly " <<<"$out2" | sed 's/.*reshape_position=//; s/ .*//')"
if [ -z "$z_at" ] || [ "$z_at" = none ] || ! grep -q "^Z disks=3 mismatch_cnt=0$" <<<"$out2" ||
    [ "$(grep -m1 "^ZSUM " <<<"$out2" | cut -d' ' -f2)" != "$sum_z" ]; then
    echo "FAIL reshape10 uraid shrink-4to3 finished by linux (md found the reshape at '$z_at'):"; tail -30 <<<"$out2"; exit 1
fi
echo "PASS reshape10 uraid shrink-4to3 with a bitmap finished by linux (uraid stopped at $z_pos, md assembled it at reshape_position $z_at and finished: 3 devices, check 0 mismatches, the sha256 of the 40M kept)"
