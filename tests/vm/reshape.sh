#!/usr/bin/env bash
# A raid5 stopped by Linux md in the middle of a reshape, read by uraid (issue 12): in one VM
# boot, mdadm creates a 3-member raid5, fills it from the pattern disk and records its sha256,
# adds a spare and grows to 4 members (mdadm's default: a new data offset, no backup file)
# with the resync speed held low; once sync_completed is past 0 and short of the end the
# reshape is frozen and the array stopped. On the host, uraid examine must show md's reshape
# position and uraid read must give exactly the sha256 Linux recorded.
# Second array, same boot: a chunk-size change (64K -> 32K) stopped partway by mdadm --stop;
# uraid read must give exactly what Linux md itself reads when it re-assembles the stopped
# array read-only (and the recorded sha256 where Linux still reads that).
# Then both ways (issue 15): uraid grow --continue finishes both of Linux's reshapes (same
# bytes, parity consistent); uraid starts a 3 -> 4 grow and a chunk change of its own and
# stops them mid-way (--stop-at); in a second boot Linux md assembles uraid's finished
# grow (same bytes, check 0 mismatches) and finishes uraid's two reshapes (same bytes,
# check 0 mismatches, the new shape). Two more of uraid's, stopped mid-way and finished by
# Linux in the second boot: a raid0 grown 2 -> 3 (on disk a raid4 mid-reshape, which Linux
# finishes and mdadm --grow --level=0 takes back to a raid0 of 3, same bytes) and a degraded
# raid5 grown 4 -> 5 (Linux finishes it degraded, same bytes). And a raid0 of 3 shrunk to 2
# with --array-size (on disk a raid4 of 4 -> 3 mid-reshape, its parity role missing): Linux
# finishes it, mdadm --grow --level=0 takes it to a raid0 of 2 (the parity member leaves),
# same kept bytes, and uraid reads Linux's raid0 with the departed device offered too.
# Third array in the first boot: a shrink 4 -> 3 (after --array-size) stopped mid-way;
# mdadm 4.2 keeps it with a backup file (no new data offset), which uraid refuses by name.
# Fourth to sixth: a raid6 grown 4 -> 5 and a raid5 layout change, each stopped mid-way
# (uraid reads what Linux recorded, or what Linux itself reads, and finishes them), and a
# raid5 of 4 made a raid6 of 5 (--level=6 --raid-devices=5), whose reshape also rebuilds the
# new Q device (md's recovery_offset following the position): uraid reads the sha256 Linux
# recorded and what Linux itself reads, finishes it (raid6 left-symmetric of 5, P and Q
# consistent), and in the second boot Linux assembles it with no reshape left, check 0, the
# same sha256. (mdadm 4.2 on 6.12 would not start a shrink with a new offset even with room
# after the data, "Cannot set new_offset", so Linux's backwards shrink with a new offset is
# checked with superblocks written as md writes them, in the engine's restripe tests.)
# Served (issue 15, sv_* below): two more arrays in the first boot, Linux's 3 -> 4 grow
# stopped mid-way, plain and with --bitmap=internal (mdadm 4.2 on 6.12 allows that grow);
# on the host uraid serves each over NBD read-write while the reshape goes on, fio writes and
# verifies through it across the reshape position and again after the reshape ended while
# served; uraid read keeps Linux's bytes outside fio's region, parity is consistent, and in
# the second boot Linux md assembles it (no reshape left), check finds 0 mismatches and reads
# what uraid read. The bitmap one is served read-write too: uraid keeps its bitmap across
# the two geometries, and Linux finds it at +8 afterwards.
#
# The 0.91 array served (issue 12, scenario_091's SV91): in the third boot Linux also grows a
# second 0.90 raid5 with a backup file and stops it mid-way; uraid serves it read-write under
# fio while it goes on with the reshape (sv_host), its records are 0.90.00 again, and in the
# fourth boot Linux md assembles it (no reshape left), check finds 0 mismatches and it reads
# what uraid read (sv_job2, sv_verdict).
#
#   tests/vm/reshape.sh            (URAID=path/to/uraid to pick the binary)
#   RESHAPE_ONLY=091 tests/vm/reshape.sh   only the 0.90/0.91 scenario (its two boots)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
URAID="${URAID:-$ROOT/target/debug/uraid}"
"$HERE/setup.sh" >/dev/null
. "$HERE/scratch.sh"
W="$(vm_scratch reshape-vm 2200)"
# RESHAPE_KEEP=1 keeps the member images (the folder is printed) to look at by hand.
if [ -n "${RESHAPE_KEEP:-}" ]; then echo "images in $W"; else trap 'rm -rf "$W"' EXIT; fi
cd "$W"
truncate -s 32M a0 a1 a2 a3 b0 b1 b2
# Served (issue 15): Linux md's grow stopped mid-way, served read-write by uraid while the
# reshape goes on, with fio writing and verifying through NBD. Two arrays: SV (plain 1.2
# raid5) and SVB (the same with --bitmap=internal, 1M bitmap chunks). In the first boot
# Linux creates each on 3 members of 16M, fills it, records its sha256 and those of the bytes
# before SV_OFF and from SV_END on, adds a spare, grows to 4 (default new data offset, no
# backup file) and stops it mid-way. On the host `uraid serve` takes it; once the reshape is
# past SV_WAIT (and short of SV_END) fio writes [SV_OFF, SV_END) at random with crc32c verify
# headers and reads it back (the reshape crosses the region meanwhile); after the reshape has
# ended while served, fio --verify_only reads the region again through a new connection;
# uraid stop, and then uraid read must give Linux's bytes outside the region, 4 devices, no
# reshape, 0 parity mismatches. In the second boot Linux md assembles it (no reshape left),
# `check` finds 0 mismatches and its sha256 of the whole array is what uraid read. Its own
# block: merge-friendly.
SV_OFF=$((4 << 20)) SV_WAIT=$((8 << 20)) SV_END=$((20 << 20)) SV_SPEED=2000
SV_PASSED=""
sv_label() { # TAG
    case $1 in SV) echo grow-3to4 ;; SVB) echo "grow-3to4 --bitmap=internal" ;; SV91) echo "0.91 grow-3to4" ;; esac
}
sv_disks() { # TAG: the member images
    echo "${1,,}0 ${1,,}1 ${1,,}2 ${1,,}3"
}
truncate -s 16M $(sv_disks SV) $(sv_disks SVB)
sv_guest_job() { # FIRST-DISK-NUMBER: guest commands for the first boot's job (after fill etc.)
    cat <<'JOB'
# sv_grow TAG MD BITMAP(-|internal) DEV DEV DEV SPARE. The bitmap's chunk is 1M (mdadm's
# default, 64M, would give the 16M members a single bit) so that it maps many stripes.
sv_grow() {
    tag=$1 md=$2 bm=$3; shift 3
    if [ "$bm" = - ]; then bmopt=; else bmopt="--bitmap=$bm --bitmap-chunk=1M"; fi
    mdadm --create --run /dev/$md --metadata=1.2 --level=5 --layout=left-symmetric --chunk=64 \
        --raid-devices=3 $bmopt --assume-clean $1 $2 $3 2>&1
    fill $md
    n=$(cat /sys/block/$md/size)
    echo "$tag-SUM $(sum_of $md) $n"
    echo "$tag-HEAD $(dd if=/dev/$md bs=1M count=$SV_OFF_MIB 2>/dev/null | sha256sum | cut -d' ' -f1)"
    echo "$tag-TAIL $(dd if=/dev/$md bs=1M skip=$SV_END_MIB 2>/dev/null | sha256sum | cut -d' ' -f1)"
    mdadm --detail /dev/$md | grep -E "Intent Bitmap|Raid Devices" || true
    mdadm /dev/$md --add $4 2>&1
    if msg="$(mdadm --grow /dev/$md --raid-devices=4 2>&1)"; then
        echo "$msg"
        stop_mid $md freeze
        mdadm --examine $1 | grep -E "Reshape|Delta|Offset|Bitmap" || true
        echo "$tag-STOPPED"
    else
        echo "$tag-GROW-REFUSED $(echo "$msg" | tr '\n' ' ')"
        mdadm --stop /dev/$md 2>&1
    fi
}
JOB
    local d=$1
    echo "SV_OFF_MIB=$((SV_OFF >> 20)) SV_END_MIB=$((SV_END >> 20))"
    echo "sv_grow SV md3 - /dev/disk/$d /dev/disk/$((d + 1)) /dev/disk/$((d + 2)) /dev/disk/$((d + 3))"
    d=$((d + 4))
    echo "sv_grow SVB md4 internal /dev/disk/$d /dev/disk/$((d + 1)) /dev/disk/$((d + 2)) /dev/disk/$((d + 3))"
}
sv_disk_args() { # TAG...: harness --disk arguments
    local t m
    for t in "$@"; do for m in $(sv_disks "$t"); do printf -- '--disk %s ' "$m"; done; done
}
sv_pos() { # CTL: the reshape's position in array bytes, "none" when no reshape runs
    "$URAID" detail --json --control "$1" 2>/dev/null | python3 -c 'import json,sys
s = json.load(sys.stdin).get("sync")
print(s["done_units"] * 512 if s and s.get("kind") == "reshape" else "none")' 2>/dev/null || echo gone
}
sv_fio() { # SOCK JSON EXTRA...: fio over [SV_OFF, SV_END) through uraid's NBD export
    local sock=$1 json=$2; shift 2
    timeout 300 fio --name=served --ioengine=nbd --uri="nbd+unix:///md0?socket=$sock" --rw=randwrite \
        --bs=4k --iodepth=8 --offset=$SV_OFF --size=$((SV_END - SV_OFF)) --verify=crc32c \
        --verify_fatal=1 --randseed=1515 --output-format=json --output="$json" "$@" \
        >/dev/null 2>"$json.err" || true
}
sv_io() { # JSON: "ERROR WRITE-BYTES READ-BYTES" of fio's job
    python3 -c 'import json,sys
t = open(sys.argv[1]).read(); j = json.loads(t[t.index("{"):])["jobs"][0]
print(j["error"], j["write"]["io_bytes"], j["read"]["io_bytes"])' "$1" 2>/dev/null || echo "no-json 0 0"
}
sv_mib() { # BYTES (or a word): in MiB
    case $1 in *[!0-9]*|"") echo "$1" ;; *) awk -v b="$1" 'BEGIN { printf "%.1f MiB\n", b / 1048576 }' ;; esac
}
sv_range() { # OFFSET LENGTH MEMBERS...: sha256 of that range of the array, read by uraid
    local o=$1 n=$2; shift 2
    "$URAID" read --offset "$o" --length "$n" "$@" | sha256sum | cut -d' ' -f1
}
sv_host() { # TAG: serve Linux's stopped grow, fio through it while the reshape runs
    local tag=$1 label srv pos pos0 pos1 io want i=0
    label="$(sv_label "$tag")"
    local members=($(sv_disks "$tag")) sock="$W/$tag.sock" ctl="$W/$tag.ctl"
    sv_fail() { echo "FAIL reshape served $label: $*"; }
    local refused; refused="$(grep -m1 "^$tag-GROW-REFUSED" <<<"$out" || true)"
    if [ -n "$refused" ]; then sv_fail "mdadm refused the grow: ${refused#* }"; return 1; fi
    if ! grep -q "^$tag-STOPPED" <<<"$out"; then sv_fail "the guest did not stop the grow mid-way"; return 1; fi
    local sectors head_sum tail_sum
    sectors="$(grep -m1 "^$tag-SUM " <<<"$out" | cut -d' ' -f3)"
    head_sum="$(grep -m1 "^$tag-HEAD " <<<"$out" | cut -d' ' -f2)"
    tail_sum="$(grep -m1 "^$tag-TAIL " <<<"$out" | cut -d' ' -f2)"
    local md_pos; md_pos="$(mdadm --examine "${members[0]}" 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')"
    mkdir -p "$W/run"
    URAID_RUN_DIR="$W/run" "$URAID" serve --nbd "unix:$sock" --control "$ctl" --name md0 \
        --speed-max "$SV_SPEED" "${members[@]}" >"$tag-serve.log" 2>&1 &
    srv=$!
    sv_end() { # stop the server (cleanly if it can); its exit status in sv_rc
        "$URAID" stop --control "$ctl" >/dev/null 2>&1 || kill "$srv" 2>/dev/null || true
        sv_rc=0; wait "$srv" 2>/dev/null || sv_rc=$?
    }
    while [ ! -S "$ctl" ] || [ ! -S "$sock" ]; do
        i=$((i + 1)); kill -0 "$srv" 2>/dev/null && [ $i -lt 300 ] ||
            { sv_fail "uraid serve did not start"; cat "$tag-serve.log"; sv_end; return 1; }
        sleep 0.1
    done
    local ro; ro="$(grep -m1 "served read-only" "$tag-serve.log" || true)"
    if [ -n "$ro" ]; then
        sv_fio "$sock" "$tag-f1.json" --do_verify=1
        io="$(sv_io "$tag-f1.json")"
        sv_fail "md stopped it at $md_pos; uraid serves it read-only, so fio's writes fail (fio error ${io%% *} ($(python3 -c 'import os,sys; print(os.strerror(int(sys.argv[1])))' "${io%% *}" 2>/dev/null)), $(cut -d' ' -f2 <<<"$io") bytes written); uraid said: ${ro#uraid: }"
        sv_end; return 1
    fi
    # Wait until the reshape is past SV_WAIT: fio's region then lies on both sides of it.
    i=0
    while pos="$(sv_pos "$ctl")"; [ "$pos" != none ] && [ "$pos" != gone ] && [ "$pos" -lt $SV_WAIT ]; do
        i=$((i + 1)); [ $i -lt 1200 ] || break; sleep 0.1
    done
    if [ "$pos" = none ] || [ "$pos" = gone ] || [ "$pos" -lt $SV_WAIT ] || [ "$pos" -ge $SV_END ]; then
        sv_fail "the reshape is at '$pos' bytes before fio, not within [$SV_WAIT, $SV_END)"
        cat "$tag-serve.log"; sv_end; return 1
    fi
    pos0=$pos
    sv_fio "$sock" "$tag-f1.json" --do_verify=1
    pos1="$(sv_pos "$ctl")"
    io="$(sv_io "$tag-f1.json")"; want="0 $((SV_END - SV_OFF)) $((SV_END - SV_OFF))"
    if [ "$io" != "$want" ]; then
        sv_fail "fio write+verify during the reshape: error/written/read '$io', want '$want'"
        head -5 "$tag-f1.json.err"; tail -5 "$tag-serve.log"; sv_end; return 1
    fi
    # The reshape ends while served.
    i=0
    while pos="$(sv_pos "$ctl")"; [ "$pos" != none ] && [ "$pos" != gone ]; do
        i=$((i + 1)); [ $i -lt 3000 ] || break; sleep 0.2
    done
    if [ "$pos" != none ]; then
        sv_fail "the served reshape did not end (at '$pos')"; tail -20 "$tag-serve.log"; sv_end; return 1
    fi
    sv_fio "$sock" "$tag-f2.json" --verify_only
    io="$(sv_io "$tag-f2.json")"
    if [ "${io%% *}" != 0 ] || [ "${io##* }" != $((SV_END - SV_OFF)) ]; then
        sv_fail "fio --verify_only after the reshape: error/written/read '$io'"
        head -5 "$tag-f2.json.err"; sv_end; return 1
    fi
    sv_end
    if [ "$sv_rc" != 0 ] || ! grep -q "stopped cleanly" "$tag-serve.log"; then
        sv_fail "uraid serve exited $sv_rc"; tail -20 "$tag-serve.log"; return 1
    fi
    local disks bytes full
    disks="$("$URAID" detail --json "${members[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["raid_disks"])')"
    bytes="$("$URAID" detail --json "${members[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])')"
    if [ "$disks" != 4 ] || "$URAID" examine "${members[0]}" | grep -q "Reshape pos'n" ||
        ! "$URAID" check -q "${members[@]}" | grep -q "mismatch_cnt: 0"; then
        sv_fail "after the served reshape: $disks devices, a reshape left or parity mismatches"
        "$URAID" examine "${members[0]}"; return 1
    fi
    if [ "$(sv_range 0 $SV_OFF "${members[@]}")" != "$head_sum" ] ||
        [ "$(sv_range $SV_END $((sectors * 512 - SV_END)) "${members[@]}")" != "$tail_sum" ]; then
        sv_fail "uraid reads other bytes than Linux recorded outside fio's region [$SV_OFF, $SV_END)"
        return 1
    fi
    full="$("$URAID" read "${members[@]}" | sha256sum | cut -d' ' -f1)"
    echo "$tag-URAID $full $bytes" >>sv-sums
    echo "PASS reshape served $label (host): md stopped it at $md_pos; served read-write, fio wrote and verified [$(sv_mib $SV_OFF), $(sv_mib $SV_END)) while the reshape went on from $(sv_mib "$pos0") (at $(sv_mib "$pos1") after fio), verified it again after the reshape ended; 4 devices, parity 0 mismatches, Linux's bytes outside the region"
    SV_PASSED="$SV_PASSED $tag"
}
sv_job2() { # FIRST-DISK-NUMBER: guest commands for the second boot, for the arrays that passed
    local d=$1 t n=3
    for t in $SV_PASSED; do
        echo "finish md$n /dev/disk/$d /dev/disk/$((d + 1)) /dev/disk/$((d + 2)) /dev/disk/$((d + 3))"
        echo "echo \"$t-LINUX \$(sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum /dev/md$n | cut -d' ' -f1) \$(cat /sys/block/md$n/size)\""
        echo "echo \"$t-BITMAP \$(cat /sys/block/md$n/md/bitmap/location 2>/dev/null)\""
        echo "mdadm --stop /dev/md$n"
        d=$((d + 4)); n=$((n + 1))
    done
}
sv_verdict() { # after the second boot: Linux's read of the arrays uraid served
    local t n=3 rc=0 line at want got bm bm_ok
    for t in $SV_PASSED; do
        line="$(grep -m1 "^md$n disks=" <<<"$out2" || true)"
        at="$(grep -m1 "^md$n at-assembly " <<<"$out2" | sed 's/.*=//')"
        want="$(grep -m1 "^$t-URAID " sv-sums)"
        got="$(grep -m1 "^$t-LINUX " <<<"$out2" || true)"
        bm="$(grep -m1 "^$t-BITMAP" <<<"$out2" | cut -s -d' ' -f2)"
        # md's bitmap/location: the internal bitmap's offset ("+8"), none (or absent) without one.
        case $t in
        SVB) [ -n "$bm" ] && [ "$bm" != none ] && bm_ok=1 || bm_ok=0 ;;
        *) [ -z "$bm" ] || [ "$bm" = none ] && bm_ok=1 || bm_ok=0 ;;
        esac
        if [ "$at" != none ] || [ "$line" != "md$n disks=4 chunk=65536 mismatch_cnt=0" ] || [ $bm_ok != 1 ] ||
            [ "${got#* }" != "$(cut -d' ' -f2 <<<"$want") $(($(cut -d' ' -f3 <<<"$want") / 512))" ]; then
            echo "FAIL reshape served $(sv_label $t) read by linux: at assembly reshape_position '$at', '$line', bitmap '$bm', Linux '$got', uraid '$want'"
            tail -30 <<<"$out2"; rc=1
        else
            echo "PASS reshape served $(sv_label $t) read by linux ($line, no reshape at assembly, bitmap ${bm:-none}, the sha256 uraid read)"
        fi
        n=$((n + 1))
    done
    return $rc
}
prefix_sum() { # BYTES MEMBERS...: sha256 of the array's first BYTES
    local n=$1; shift
    "$URAID" read --length "$n" "$@" | sha256sum | cut -d' ' -f1
}
parity_ok() { "$URAID" check -q "$@" | grep -q "mismatch_cnt: 0"; }
job_finish() { # the guest's finish function (the second and fourth boots)
    cat <<'JOB'
finish() { # MD DEVS...: assemble, let md finish a reshape in progress, print what it holds
    md=$1; shift
    mdadm --assemble --run /dev/$md "$@" 2>&1
    echo "$md at-assembly reshape_position=$(cat /sys/block/$md/md/reshape_position)"
    cat /proc/mdstat
    mdadm --readwrite /dev/$md 2>/dev/null || true
    mdadm --wait /dev/$md >/dev/null 2>&1 || true
    while [ "$(cat /sys/block/$md/md/sync_action)" != idle ] ||
          [ "$(cat /sys/block/$md/md/reshape_position)" != none ]; do sleep 0.5; done
    echo check > /sys/block/$md/md/sync_action; sleep 0.5
    mdadm --wait /dev/$md >/dev/null 2>&1 || true
    while [ "$(cat /sys/block/$md/md/sync_action)" != idle ]; do sleep 0.2; done
    echo "$md disks=$(cat /sys/block/$md/md/raid_disks) chunk=$(cat /sys/block/$md/md/chunk_size) mismatch_cnt=$(cat /sys/block/$md/md/mismatch_cnt)"
}
JOB
}
fail=0
# RESHAPE_ONLY=091: straight to scenario_091.
if [ "${RESHAPE_ONLY:-}" != 091 ]; then
cat > job.sh <<'JOB'
set -e
echo 200 > /proc/sys/dev/raid/speed_limit_min
echo 200 > /proc/sys/dev/raid/speed_limit_max
# stop_mid MD HOW: wait until the reshape is partway, then stop the array: HOW=freeze
# freezes it first (echo frozen > sync_action), HOW=mdadm leaves that to mdadm --stop (which
# sets sync_max where the reshape is and lets md record its position there).
stop_mid() {
    md=$1 how=$2
    echo 200 > /sys/block/$md/md/sync_speed_min
    echo 200 > /sys/block/$md/md/sync_speed_max
    i=0
    while :; do
        sc="$(cat /sys/block/$md/md/sync_completed)"
        case "$sc" in
        none|"0 / "*) ;;
        *) done_="${sc%% /*}"; total="${sc##*/ }"
           [ "$done_" -gt 0 ] && [ "$done_" -lt "$total" ] && break ;;
        esac
        i=$((i + 1)); [ $i -lt 600 ] || { echo "NO-PROGRESS $md $sc"; cat /proc/mdstat; exit 1; }
        sleep 0.2
    done
    [ "$how" = mdadm ] || echo frozen > /sys/block/$md/md/sync_action
    echo "$md ($how) at sync_completed $(cat /sys/block/$md/md/sync_completed) reshape_position $(cat /sys/block/$md/md/reshape_position)"
    cat /proc/mdstat
    mdadm --stop /dev/$md 2>&1
}
# linux_reads TAG MD DEVS...: assemble the stopped array read-only and print Linux's own
# sha256 of it (what md itself reads from the members), then stop it again.
linux_reads() {
    tag=$1 md=$2; shift 2
    mdadm --assemble --readonly /dev/$md "$@" 2>&1
    echo "$tag $(sum_of $md) reshape_position $(cat /sys/block/$md/md/reshape_position)"
    mdadm --stop /dev/$md 2>&1
}
# linux_reads_auto TAG MD DEVS...: linux_reads through md's start_ro (auto-read-only: no
# reshape resumes, no superblock written until a write) instead of --readonly, which hit a
# kernel BUG with a frozen grow (md0 below).
linux_reads_auto() {
    echo 1 > /sys/module/md_mod/parameters/start_ro
    tag=$1 md=$2; shift 2
    mdadm --assemble /dev/$md "$@" 2>&1
    echo "$tag $(sum_of $md) reshape_position $(cat /sys/block/$md/md/reshape_position)"
    mdadm --stop /dev/$md 2>&1
    echo 0 > /sys/module/md_mod/parameters/start_ro
}
sum_of() { # MD: sha256 of the whole array, after dropping caches
    sync; echo 3 > /proc/sys/vm/drop_caches
    sha256sum /dev/$1 | cut -d' ' -f1
}
fill() { # MD: the pattern disk over the whole array
    n=$(cat /sys/block/$1/size)
    dd if=/dev/disk/0 of=/dev/$1 bs=512 count=$n iflag=fullblock conv=fsync 2>/dev/null || \
        dd if=/dev/disk/0 of=/dev/$1 bs=512 count=$n conv=fsync 2>/dev/null
}
mdadm --create --run /dev/md0 --metadata=1.2 --level=5 --layout=left-symmetric --chunk=64 \
    --raid-devices=3 --assume-clean /dev/disk/1 /dev/disk/2 /dev/disk/3 2>&1
fill md0
echo "SUM-A $(sum_of md0) $(cat /sys/block/md0/size)"
mdadm /dev/md0 --add /dev/disk/4 2>&1
mdadm --grow /dev/md0 --raid-devices=4 2>&1
stop_mid md0 freeze
mdadm --examine /dev/disk/1 | grep -E "Reshape|Delta|Offset" || true
# No read-only re-assembly here: on 6.12.111 `mdadm --assemble --readonly` of this stopped
# grow hit "kernel BUG at mm/slub.c:550" in md0_raid5 (a double free) and hung the guest.

mdadm --create --run /dev/md1 --metadata=1.2 --level=5 --layout=left-symmetric --chunk=64 \
    --raid-devices=3 --assume-clean /dev/disk/5 /dev/disk/6 /dev/disk/7 2>&1
fill md1
echo "SUM-B $(sum_of md1) $(cat /sys/block/md1/size)"
if mdadm --grow /dev/md1 --chunk=32 2>&1; then
    stop_mid md1 mdadm
    mdadm --examine /dev/disk/5 | grep -E "Reshape|Chunk|Offset" || true
    linux_reads RO-B md1 /dev/disk/5 /dev/disk/6 /dev/disk/7
else
    echo "CHUNK-GROW-REFUSED"
fi
# Third array: a shrink (4 -> 3 devices, after --array-size), md's backwards reshape.
mdadm --create --run /dev/md2 --metadata=1.2 --level=5 --layout=left-symmetric --chunk=64 \
    --raid-devices=4 --assume-clean /dev/disk/8 /dev/disk/9 /dev/disk/10 /dev/disk/11 2>&1
fill md2
keep=$(( $(cat /sys/block/md2/md/component_size) * 2 ))
sync; echo 3 > /proc/sys/vm/drop_caches
echo "SUM-E $(head -c $((keep * 1024)) /dev/md2 | sha256sum | cut -d' ' -f1) $((keep * 2))"
mdadm --grow /dev/md2 --array-size=$keep 2>&1
if mdadm --grow /dev/md2 --raid-devices=3 2>&1; then
    echo "SHRINK-NO-BACKUP"
else
    mdadm --grow /dev/md2 --raid-devices=3 --backup-file=/root/md2.bk 2>&1
    echo "SHRINK-BACKUP"
fi
stop_mid md2 mdadm
mdadm --examine /dev/disk/8 | grep -E "Reshape|Delta|Offset|Raid Devices" || true
# With a backup file mdadm will not assemble it without that file (mdadm 4.2 crashed trying),
# so Linux's own read is taken only for a shrink with a new data offset.
if mdadm --examine /dev/disk/8 | grep -q "New Offset"; then
    linux_reads RO-E md2 /dev/disk/8 /dev/disk/9 /dev/disk/10 /dev/disk/11
fi
# Fourth array: a raid6 grown 4 -> 5 (Q's rotation with a new device count).
mdadm --create --run /dev/md6 --metadata=1.2 --level=6 --layout=left-symmetric --chunk=64 \
    --raid-devices=4 --assume-clean /dev/disk/12 /dev/disk/13 /dev/disk/14 /dev/disk/15 2>&1
fill md6
echo "SUM-R $(sum_of md6) $(cat /sys/block/md6/size)"
mdadm /dev/md6 --add /dev/disk/16 2>&1
mdadm --grow /dev/md6 --raid-devices=5 2>&1
stop_mid md6 freeze
mdadm --examine /dev/disk/12 | grep -E "Reshape|Delta|Offset" || true
# Fifth: a raid5 of 4 becoming a raid6 of 5 (mdadm's takeover to the -6 layout with the Q
# role empty, then the restripe to left-symmetric over 5, which rebuilds the spare md puts in
# that role), stopped mid-way, and Linux's own read of it (RO-S). md sets its offset rule
# (min_offset_diff) when the personality starts, and the takeover starts it before mdadm sets
# the new data offsets: the reshape runs without its safe distance, recording its position
# only every 10 s, so stopped at a random moment md has moved stripes over old ones past the
# position it recorded (with mdadm's default 1 MiB data offset, moved by 512 KiB, at 200 KiB/s:
# 2304 sectors), and Linux itself then reads other bytes than it recorded. So the data offset
# is 16 MiB (mdadm moves it by 8 MiB), and the speed is held at 200 KiB/s (mdadm's monitor
# raises sync_speed_min to 200000 for a reshape that keeps the data disks): 10 s of it stay
# far within what the offset moves.
mdadm --create --run /dev/md8 --metadata=1.2 --level=5 --layout=left-symmetric --chunk=64 \
    --data-offset=16M --raid-devices=4 --assume-clean /dev/disk/17 /dev/disk/18 /dev/disk/19 \
    /dev/disk/20 2>&1
fill md8
echo "SUM-S $(sum_of md8) $(cat /sys/block/md8/size)"
mdadm /dev/md8 --add /dev/disk/21 2>&1
# The holder outlives the array by a moment (stop_mid stops md8 before the holder is told to
# end), so a write to md8's sysfs may fail once md8 is gone: under `set -e` that failure would
# end the holder with status 1 and `wait` would end the job, so the writes may fail.
hold_speed() {
    while [ ! -e /tmp/md8-held ]; do
        { echo 200 > /sys/block/md8/md/sync_speed_min
          echo 200 > /sys/block/md8/md/sync_speed_max; } 2>/dev/null || true
        sleep 0.05
    done
}
hold_speed &
held=$!
if mdadm --grow /dev/md8 --level=6 --raid-devices=5 2>&1; then
    stop_mid md8 freeze
    touch /tmp/md8-held; wait $held
    mdadm --examine /dev/disk/21 | grep -E "Raid Level|Layout|Reshape|Delta|Offset|Recovery" || true
    linux_reads_auto RO-S md8 /dev/disk/17 /dev/disk/18 /dev/disk/19 /dev/disk/20 /dev/disk/21
else
    touch /tmp/md8-held; wait $held
    echo "LEVEL-GROW-REFUSED"
fi
# Sixth: a raid5 layout change (left-symmetric -> right-asymmetric), stopped mid-way.
mdadm --create --run /dev/md9 --metadata=1.2 --level=5 --layout=left-symmetric --chunk=64 \
    --raid-devices=3 --assume-clean /dev/disk/22 /dev/disk/23 /dev/disk/24 2>&1
fill md9
echo "SUM-T $(sum_of md9) $(cat /sys/block/md9/size)"
if mdadm --grow /dev/md9 --layout=right-asymmetric 2>&1; then
    stop_mid md9 mdadm
    mdadm --examine /dev/disk/22 | grep -E "Layout|Reshape|Offset" || true
    linux_reads RO-T md9 /dev/disk/22 /dev/disk/23 /dev/disk/24
else
    echo "LAYOUT-GROW-REFUSED"
fi
JOB
sv_guest_job 25 >>job.sh
echo "echo GUEST-OK" >>job.sh
rc=0
truncate -s 32M e0 e1 e2 e3 r0 r1 r2 r3 r4 t0 t1 t2
# The raid5 -> raid6 one: 8 MiB of data on each after its 16 MiB data offset (below).
truncate -s 24M s0 s1 s2 s3 s4
out="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job.sh --boot-timeout 900 \
    --disk a0 --disk a1 --disk a2 --disk a3 --disk b0 --disk b1 --disk b2 \
    --disk e0 --disk e1 --disk e2 --disk e3 \
    --disk r0 --disk r1 --disk r2 --disk r3 --disk r4 --disk s0 --disk s1 --disk s2 \
    --disk s3 --disk s4 --disk t0 --disk t1 --disk t2 $(sv_disk_args SV SVB) 2>&1)" || rc=$?
if [ $rc != 0 ] || ! grep -q GUEST-OK <<<"$out"; then
    echo "FAIL reshape (guest, rc $rc):"; tail -40 <<<"$out"; exit 1
fi
fail=0
# check NAME TAG RO-TAG STRICT MEMBERS...: uraid examine shows md's reshape position, and
# uraid read gives exactly what Linux md itself reads when it assembles the stopped array
# (RO-TAG). With STRICT=1 that must also be the sha256 recorded before the grow (TAG).
check() {
    name=$1 tag=$2 rotag=$3 strict=$4; shift 4
    want="$(grep -m1 "^$tag " <<<"$out" | cut -d' ' -f2)"
    linux="$(grep -m1 "^$rotag " <<<"$out" | cut -d' ' -f2)"
    md_pos="$(mdadm --examine "$1" 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')" || true
    u_pos="$("$URAID" examine "$1" 2>&1 | grep "Reshape pos'n" | sed 's/.*: *//')" || true
    if [ -z "$md_pos" ] || [ "$md_pos" != "$u_pos" ]; then
        echo "FAIL reshape $name: mdadm --examine says reshape at '$md_pos', uraid examine '$u_pos'"
        fail=1; return
    fi
    got="$("$URAID" read "$@" 2>"$name.err" | sha256sum | cut -d' ' -f1)" || true
    if [ -z "$linux" ] || [ "$got" != "$linux" ]; then
        echo "FAIL reshape $name: uraid read sha256 $got; Linux md read '$linux' from the same members"
        cat "$name.err"; fail=1; return
    fi
    if [ "$got" = "$want" ]; then
        echo "PASS reshape $name: stopped at $md_pos, uraid read the sha256 Linux recorded before the reshape"
    elif [ "$strict" = 1 ]; then
        echo "FAIL reshape $name: uraid and Linux read $got, but Linux recorded $want before the reshape"
        fail=1
    else
        echo "PASS reshape $name: stopped at $md_pos, uraid read what Linux md reads ($got); NOTE: Linux itself no longer reads the sha256 it recorded before the reshape ($want)"
    fi
}
check grow-3to4 SUM-A SUM-A 1 a3 a2 a1 a0
if grep -q CHUNK-GROW-REFUSED <<<"$out"; then
    echo "FAIL reshape chunk-64to32: mdadm refused the chunk change"; fail=1
else
    check chunk-64to32 SUM-B RO-B 0 b2 b1 b0
fi
check raid6-grow-4to5 SUM-R SUM-R 1 r4 r3 r2 r1 r0
for t in "LEVEL-GROW-REFUSED raid5-to-raid6-4to5" "LAYOUT-GROW-REFUSED layout-ls-to-ra"; do
    if grep -q "^${t%% *}" <<<"$out"; then echo "FAIL reshape ${t#* }: mdadm refused it"; fail=1; fi
done
# mdadm's raid5 -> raid6 of 5 is md's takeover to a degraded raid6 (left-symmetric-6, the Q
# role missing) whose reshape to left-symmetric also writes the new device (md moves its
# recovery_offset with the reshape): uraid reads it as md does (that member only in the new
# geometry, below its recovery_offset), and so what Linux recorded.
grep -q "^LEVEL-GROW-REFUSED" <<<"$out" || check raid5-to-raid6-4to5 SUM-S RO-S 1 s4 s3 s2 s1 s0
grep -q "^LAYOUT-GROW-REFUSED" <<<"$out" || check layout-ls-to-ra SUM-T RO-T 0 t2 t1 t0
if [ $fail != 0 ]; then
    grep -v '^SUM' <<<"$out" | tail -40
    exit 1
fi

# Linux -> uraid: uraid finishes the reshapes Linux md left.
sum_a="$(grep -m1 "^SUM-A " <<<"$out" | cut -d' ' -f2)"
sectors_a="$(grep -m1 "^SUM-A " <<<"$out" | cut -d' ' -f3)"
ro_b="$(grep -m1 "^RO-B " <<<"$out" | cut -d' ' -f2)"
sectors_b="$(grep -m1 "^SUM-B " <<<"$out" | cut -d' ' -f3)"
if ! "$URAID" grow -q --continue a0 a1 a2 a3 >cont-a.log 2>&1; then
    echo "FAIL reshape continue grow-3to4: uraid grow --continue failed"; cat cont-a.log; exit 1
fi
if [ "$("$URAID" detail --json a0 a1 a2 a3 | python3 -c 'import json,sys; print(json.load(sys.stdin)["raid_disks"])')" != 4 ] ||
    [ "$(prefix_sum $((sectors_a * 512)) a0 a1 a2 a3)" != "$sum_a" ] || ! parity_ok a0 a1 a2 a3; then
    echo "FAIL reshape continue grow-3to4: after uraid finished Linux's grow the bytes or the parity differ"
    cat cont-a.log; exit 1
fi
echo "PASS reshape continue grow-3to4: uraid finished Linux md's grow (4 devices, the sha256 Linux recorded, parity consistent)"
if ! "$URAID" grow -q --continue b0 b1 b2 >cont-b.log 2>&1 ||
    [ "$(prefix_sum $((sectors_b * 512)) b0 b1 b2)" != "$ro_b" ] || ! parity_ok b0 b1 b2; then
    echo "FAIL reshape continue chunk-64to32: uraid did not finish Linux's chunk change with the same bytes"
    cat cont-b.log; exit 1
fi
echo "PASS reshape continue chunk-64to32: uraid finished Linux md's chunk change (what Linux read, parity consistent)"

# Linux's shrink, stopped mid-way: uraid reads the kept bytes and finishes it (3 devices and a
# spare), or, where mdadm needed its backup file, refuses before writing anything.
# Linux's shrink, stopped mid-way. With a new data offset (no backup file), uraid reads what
# Linux md reads (RO-E) and finishes it: 3 devices and a spare. Where mdadm keeps the
# shrink with its backup file (no new offset: mdadm 4.2 here), the members alone do not say
# where the moving stripes are: uraid refuses to read or continue it, naming the backup
# file, and writes nothing.
sum_e="$(grep -m1 "^RO-E " <<<"$out" | cut -d' ' -f2 || true)"
sectors_e="$(grep -m1 "^SUM-E " <<<"$out" | cut -d' ' -f3)"
e_before="$(cat e0 e1 e2 e3 | sha256sum)"
if ! mdadm --examine e0 | grep -q "New Offset"; then
    rd="$("$URAID" read e0 e1 e2 e3 2>&1 >/dev/null)" && rd_rc=0 || rd_rc=$?
    ct="$("$URAID" grow -q --continue e0 e1 e2 e3 2>&1)" && ct_rc=0 || ct_rc=$?
    if [ $rd_rc = 0 ] || [ $ct_rc = 0 ] || ! grep -q "backup-file" <<<"$rd" ||
        ! grep -q "backup-file" <<<"$ct" || [ "$(cat e0 e1 e2 e3 | sha256sum)" != "$e_before" ]; then
        echo "FAIL reshape shrink-4to3 (mdadm's backup file): uraid read rc $rd_rc ($rd), continue rc $ct_rc ($ct)"
        exit 1
    fi
    echo "PASS reshape shrink-4to3 (mdadm's backup file): uraid refuses to read or continue it, naming the backup file, members unchanged ($(head -c 150 <<<"$rd"))"
else
    got_e="$("$URAID" read e0 e1 e2 e3 | sha256sum | cut -d' ' -f1)"
    if [ -z "$sum_e" ] || [ "$got_e" != "$sum_e" ]; then
        echo "FAIL reshape shrink-4to3: uraid read $got_e of Linux's stopped shrink, Linux md read '$sum_e'"
        exit 1
    fi
    if ! "$URAID" grow -q --continue e0 e1 e2 e3 >cont-e.log 2>&1; then
        echo "FAIL reshape continue shrink-4to3: uraid grow --continue failed"; cat cont-e.log; exit 1
    fi
    det="$("$URAID" detail --json e0 e1 e2 e3)"
    disks="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["raid_disks"])' <<<"$det")"
    if [ "$disks" != 3 ] || [ "$(prefix_sum $((sectors_e * 512)) e0 e1 e2 e3)" != "$sum_e" ] ||
        ! parity_ok e0 e1 e2 e3; then
        echo "FAIL reshape continue shrink-4to3: after uraid finished Linux's shrink: $disks devices, or bytes/parity differ"
        exit 1
    fi
    echo "PASS reshape continue shrink-4to3: uraid read and finished Linux md's shrink (3 devices, the bytes Linux read, parity consistent)"
fi

# Linux's raid6 grow, finished by uraid: the bytes, parity consistent, 5 devices.
sum_r="$(grep -m1 "^SUM-R " <<<"$out" | cut -d' ' -f2)"; sectors_r="$(grep -m1 "^SUM-R " <<<"$out" | cut -d' ' -f3)"
continue_linux() { # NAME WANT-DISKS SHA256 SECTORS MEMBERS...
    local name=$1 want=$2 sum=$3 sectors=$4 disks; shift 4
    if ! "$URAID" grow -q --continue "$@" >"cont-$name.log" 2>&1; then
        echo "FAIL reshape continue $name: uraid grow --continue failed"; cat "cont-$name.log"; exit 1
    fi
    disks="$("$URAID" detail --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["raid_disks"])')"
    if [ "$disks" != "$want" ] || [ "$(prefix_sum $((sectors * 512)) "$@")" != "$sum" ] || ! parity_ok "$@"; then
        echo "FAIL reshape continue $name: after uraid finished Linux's reshape: $disks devices (want $want), or bytes/parity differ"
        exit 1
    fi
    echo "PASS reshape continue $name: uraid finished Linux md's reshape ($want devices, the sha256 Linux recorded, parity consistent)"
}
continue_linux raid6-grow-4to5 5 "$sum_r" "$sectors_r" r0 r1 r2 r3 r4
# Linux's raid5 -> raid6 finished by uraid: a raid6 left-symmetric of 5, the member the
# reshape rebuilt in sync.
sum_s="$(grep -m1 "^SUM-S " <<<"$out" | cut -d' ' -f2)"; sectors_s="$(grep -m1 "^SUM-S " <<<"$out" | cut -d' ' -f3)"
continue_linux raid5-to-raid6-4to5 5 "$sum_s" "$sectors_s" s0 s1 s2 s3 s4
shape_s="$("$URAID" detail --json s0 s1 s2 s3 s4 | python3 -c 'import json,sys
d = json.load(sys.stdin); print(d["level"], d["layout"], *sorted({m["state"] for m in d["members"]}))')"
if [ "$shape_s" != "raid6 left-symmetric active" ]; then
    echo "FAIL reshape continue raid5-to-raid6-4to5: after uraid finished it: '$shape_s', want a raid6 left-symmetric with every member active"
    "$URAID" detail s0 s1 s2 s3 s4; exit 1
fi
echo "PASS reshape continue raid5-to-raid6-4to5 (shape): raid6 left-symmetric, the member the reshape rebuilt in sync"
# The layout change: what Linux read of it mid-way, on the whole array, layout 1 at the end.
ro_t="$(grep -m1 "^RO-T " <<<"$out" | cut -d' ' -f2)"
sectors_t="$(grep -m1 "^SUM-T " <<<"$out" | cut -d' ' -f3)"
if ! "$URAID" grow -q --continue t0 t1 t2 >cont-t.log 2>&1 ||
    [ "$(prefix_sum $((sectors_t * 512)) t0 t1 t2)" != "$ro_t" ] || ! parity_ok t0 t1 t2 ||
    [ "$("$URAID" detail --json t0 t1 t2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["layout"])')" != right-asymmetric ]; then
    echo "FAIL reshape continue layout-ls-to-ra: uraid did not finish Linux's layout change with the same bytes"
    cat cont-t.log; "$URAID" detail t0 t1 t2; exit 1
fi
echo "PASS reshape continue layout-ls-to-ra: uraid finished Linux md's layout change (right-asymmetric, what Linux read, parity consistent)"

# Linux -> uraid, served: uraid serves Linux's stopped grows read-write under fio.
for t in SV SVB; do sv_host $t || fail=1; done

# uraid -> Linux: uraid starts reshapes and stops them mid-way; Linux md finishes them.
truncate -s 32M c0 c1 c2 c3 d0 d1 d2 d3
"$URAID" create -l 5 -c 64K --assume-clean c0 c1 c2 >/dev/null 2>&1
"$URAID" create -l 5 -c 64K --assume-clean d0 d1 d2 d3 >/dev/null 2>&1
size_of() { "$URAID" detail --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_bytes"])'; }
sc="$(size_of c0 c1 c2)"; sd="$(size_of d0 d1 d2 d3)"
head -c "$sc" /dev/urandom > pat-c; head -c "$sd" /dev/urandom > pat-d
"$URAID" write --input pat-c c0 c1 c2 >/dev/null
"$URAID" write --input pat-d d0 d1 d2 d3 >/dev/null
sum_c="$(sha256sum < pat-c | cut -d' ' -f1)"; sum_d="$(sha256sum < pat-d | cut -d' ' -f1)"
"$URAID" grow -q -n 4 --add c3 --stop-at 40000 -- c0 c1 c2 >grow-c.log 2>&1 ||
    { echo "FAIL reshape uraid grow-3to4: uraid grow failed"; cat grow-c.log; exit 1; }
"$URAID" grow -q --chunk 32K --stop-at 40000 d0 d1 d2 d3 >grow-d.log 2>&1 ||
    { echo "FAIL reshape uraid chunk-64to32: uraid grow failed"; cat grow-d.log; exit 1; }
# Two more (issue 15): a raid0 grown 2 -> 3 as mdadm grows it (uraid's raid4 takeover with
# the parity rebuilt onto the new device, then the raid4 restripe to 3 data roles stopped
# mid-way, its new parity role missing), which Linux finishes as a raid4 and then takes back
# to raid0 itself (mdadm --grow --level=0); and a degraded raid5 (one role missing) grown 4 ->
# 5, stopped mid-way, which Linux finishes degraded.
truncate -s 32M g0 g1 g2 h0 h1 h2 h3
"$URAID" create -l 0 -c 64K g0 g1 >/dev/null 2>&1
"$URAID" create -l 5 -c 64K --assume-clean -n 4 h0 h1 h2 missing >/dev/null 2>&1
sg="$(size_of g0 g1)"; sh_="$(size_of h0 h1 h2)"
head -c "$sg" /dev/urandom > pat-g; head -c "$sh_" /dev/urandom > pat-h
"$URAID" write --input pat-g g0 g1 >/dev/null
"$URAID" write --input pat-h h0 h1 h2 >/dev/null
sum_g="$(sha256sum < pat-g | cut -d' ' -f1)"; sum_h="$(sha256sum < pat-h | cut -d' ' -f1)"
"$URAID" grow -q -n 3 --add g2 --stop-at 40000 -- g0 g1 >grow-g.log 2>&1 ||
    { echo "FAIL reshape uraid raid0-grow-2to3: uraid grow failed"; cat grow-g.log; exit 1; }
"$URAID" grow -q -n 5 --add h3 --stop-at 40000 -- h0 h1 h2 >grow-h.log 2>&1 ||
    { echo "FAIL reshape uraid degraded-grow-4to5: uraid grow failed"; cat grow-h.log; exit 1; }
# And (issue 15) a shrink 4 -> 3 as mdadm asks for it (--array-size with --raid-devices),
# uraid's backwards reshape with the data offset moving up into room made by the component
# size, stopped mid-way, which Linux finishes (3 devices, the kept bytes); and a raid0's
# chunk change 64K -> 128K through a raid4 with its parity role missing, stopped mid-way,
# which Linux finishes as that raid4 and mdadm --grow --level=0 takes back to a raid0.
truncate -s 32M i0 i1 i2 i3 j0 j1 j2
"$URAID" create -l 5 -c 64K --assume-clean i0 i1 i2 i3 >/dev/null 2>&1
"$URAID" create -l 0 -c 64K j0 j1 j2 >/dev/null 2>&1
si="$(size_of i0 i1 i2 i3)"; sj="$(size_of j0 j1 j2)"
keep_i=$(( (si / 3 * 2 / 1048576 - 1) * 1048576 ))
head -c "$si" /dev/urandom > pat-i; head -c "$sj" /dev/urandom > pat-j
"$URAID" write --input pat-i i0 i1 i2 i3 >/dev/null
"$URAID" write --input pat-j j0 j1 j2 >/dev/null
sum_i="$(head -c "$keep_i" pat-i | sha256sum | cut -d' ' -f1)"; sum_j="$(sha256sum < pat-j | cut -d' ' -f1)"
"$URAID" grow -q -n 3 --array-size "$((keep_i / 1024))K" --stop-at $((keep_i / 1024)) i0 i1 i2 i3 >grow-i.log 2>&1 ||
    { echo "FAIL reshape uraid shrink-4to3: uraid grow failed"; cat grow-i.log; exit 1; }
"$URAID" grow -q --chunk 128K --stop-at 40000 j0 j1 j2 >grow-j.log 2>&1 ||
    { echo "FAIL reshape uraid raid0-chunk-64to128: uraid grow failed"; cat grow-j.log; exit 1; }
mdadm --examine i0 2>/dev/null | grep -q "Delta Devices : -1" ||
    { echo "FAIL reshape uraid shrink-4to3: mdadm --examine shows no shrink"; mdadm --examine i0; exit 1; }
# And (issue 15) a raid0 of 3 shrunk to 2 as mdadm asks for it (--array-size with
# --raid-devices): uraid's takeover to a raid4 of 4 with its parity role missing and that
# raid4's backwards shrink to 3 (the data offset moving up into room the kept size makes),
# stopped mid-way; Linux finishes the raid4 (its parity on role 2) and mdadm --grow
# --level=0 takes it to a raid0 of 2, failing and removing the parity member.
truncate -s 32M k0 k1 k2
"$URAID" create -l 0 -c 64K k0 k1 k2 >/dev/null 2>&1
sk="$(size_of k0 k1 k2)"
keep_k=$(( (sk / 3 * 2 / 1048576 - 1) * 1048576 ))
head -c "$sk" /dev/urandom > pat-k
"$URAID" write --input pat-k k0 k1 k2 >/dev/null
sum_k="$(head -c "$keep_k" pat-k | sha256sum | cut -d' ' -f1)"
"$URAID" grow -q -n 2 --array-size "$((keep_k / 1024))K" --stop-at $((keep_k / 1024)) k0 k1 k2 >grow-k.log 2>&1 ||
    { echo "FAIL reshape uraid raid0-shrink-3to2: uraid grow failed"; cat grow-k.log; exit 1; }
for m in c0 d0 g0 h0 i0 j0 k0; do
    mdadm --examine "$m" 2>/dev/null | grep -q "Reshape pos'n" ||
        { echo "FAIL reshape: mdadm --examine $m shows no reshape in progress"; mdadm --examine "$m"; exit 1; }
done
cat > job2.sh <<JOB
set -e
$(job_finish)
prefix() { # MD BYTES
    sync; echo 3 > /proc/sys/vm/drop_caches
    head -c \$2 /dev/\$1 | sha256sum | cut -d' ' -f1
}
finish md0 /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4
echo "A \$(prefix md0 $((sectors_a * 512)))"
mdadm --stop /dev/md0
finish md1 /dev/disk/5 /dev/disk/6 /dev/disk/7 /dev/disk/8
echo "C \$(prefix md1 $sc)"
mdadm --stop /dev/md1
finish md2 /dev/disk/9 /dev/disk/10 /dev/disk/11 /dev/disk/12
echo "D \$(prefix md2 $sd)"
mdadm --stop /dev/md2
finish md7 /dev/disk/13 /dev/disk/14 /dev/disk/15
echo "G \$(prefix md7 $sg)"
mdadm --grow /dev/md7 --level=0 2>&1 || true
echo "md7 back level=\$(cat /sys/block/md7/md/level) disks=\$(cat /sys/block/md7/md/raid_disks)"
echo "G0 \$(prefix md7 $sg)"
mdadm --stop /dev/md7
finish md8 /dev/disk/16 /dev/disk/17 /dev/disk/18 /dev/disk/19
echo "H \$(prefix md8 $sh_)"
mdadm --stop /dev/md8
finish md9 /dev/disk/20 /dev/disk/21 /dev/disk/22 /dev/disk/23
echo "I \$(prefix md9 $keep_i)"
mdadm --stop /dev/md9
finish md10 /dev/disk/24 /dev/disk/25 /dev/disk/26
echo "J \$(prefix md10 $sj)"
mdadm --grow /dev/md10 --level=0 2>&1 || true
echo "md10 back level=\$(cat /sys/block/md10/md/level) disks=\$(cat /sys/block/md10/md/raid_disks) chunk=\$(cat /sys/block/md10/md/chunk_size)"
echo "J0 \$(prefix md10 $sj)"
mdadm --stop /dev/md10
finish md11 /dev/disk/27 /dev/disk/28 /dev/disk/29 /dev/disk/30 /dev/disk/31
echo "S \$(prefix md11 $((sectors_s * 512)))"
echo "md11 shape level=\$(cat /sys/block/md11/md/level) layout=\$(cat /sys/block/md11/md/layout)"
mdadm --stop /dev/md11
finish md12 /dev/disk/32 /dev/disk/33 /dev/disk/34
echo "K \$(prefix md12 $keep_k)"
mdadm --grow /dev/md12 --level=0 2>&1 || true
echo "md12 back level=\$(cat /sys/block/md12/md/level) disks=\$(cat /sys/block/md12/md/raid_disks)"
echo "K0 \$(prefix md12 $keep_k)"
mdadm --stop /dev/md12
JOB
sv_job2 35 >>job2.sh
echo "echo GUEST-OK" >>job2.sh
rc=0
out2="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job2.sh --boot-timeout 900 \
    --disk a0 --disk a1 --disk a2 --disk a3 --disk c0 --disk c1 --disk c2 --disk c3 \
    --disk d0 --disk d1 --disk d2 --disk d3 --disk g0 --disk g1 --disk g2 \
    --disk h0 --disk h1 --disk h2 --disk h3 --disk i0 --disk i1 --disk i2 --disk i3 \
    --disk j0 --disk j1 --disk j2 --disk s0 --disk s1 --disk s2 --disk s3 --disk s4 \
    --disk k0 --disk k1 --disk k2 \
    $(sv_disk_args $SV_PASSED) 2>&1)" || rc=$?
if [ $rc != 0 ] || ! grep -q GUEST-OK <<<"$out2"; then
    echo "FAIL reshape uraid->linux (guest, rc $rc):"; tail -40 <<<"$out2"; exit 1
fi
verdict() { # NAME MD WANT-SUM WANT-DISKS WANT-CHUNK TAG MID(1: md found a reshape to finish)
    local line at; line="$(grep -m1 "^$2 disks=" <<<"$out2")"
    at="$(grep -m1 "^$2 at-assembly " <<<"$out2" | sed 's/.*=//')"
    if [ "$7" = 1 ] && { [ -z "$at" ] || [ "$at" = none ]; }; then
        echo "FAIL reshape $1: Linux md found no reshape in progress at assembly ($at)"
        tail -30 <<<"$out2"; fail=1; return
    fi
    if [ "$7" = 0 ] && [ "$at" != none ]; then
        echo "FAIL reshape $1: Linux md found a reshape at assembly ($at), want none"
        tail -30 <<<"$out2"; fail=1; return
    fi
    if [ "$(grep -m1 "^$6 " <<<"$out2" | cut -d' ' -f2)" != "$3" ] ||
        [ "$line" != "$2 disks=$4 chunk=$5 mismatch_cnt=0" ]; then
        echo "FAIL reshape $1: Linux md read '$(grep -m1 "^$6 " <<<"$out2")' ($line), want $3"
        tail -30 <<<"$out2"; fail=1; return
    fi
    if [ "$7" = 1 ]; then line="$line, md assembled it at reshape_position $at"; else line="$line, no reshape at assembly"; fi
    echo "PASS reshape $1 ($line)"
}
verdict "uraid-finished grow read by linux" md0 "$sum_a" 4 65536 A 0
verdict "uraid grow-3to4 finished by linux" md1 "$sum_c" 4 65536 C 1
verdict "uraid chunk-64to32 finished by linux" md2 "$sum_d" 4 32768 D 1
verdict "uraid raid0-grow-2to3 (a raid4 mid-reshape) finished by linux" md7 "$sum_g" 4 65536 G 1
if [ "$(grep -m1 "^md7 back " <<<"$out2")" != "md7 back level=raid0 disks=3" ] ||
    [ "$(grep -m1 "^G0 " <<<"$out2" | cut -d' ' -f2)" != "$sum_g" ]; then
    echo "FAIL reshape uraid raid0-grow-2to3: Linux's takeover back to raid0: $(grep -m1 "^md7 back " <<<"$out2"), $(grep -m1 "^G0 " <<<"$out2")"
    tail -30 <<<"$out2"; fail=1
else
    echo "PASS reshape uraid raid0-grow-2to3: mdadm --grow --level=0 took Linux's finished raid4 back to a raid0 of 3 with the same bytes"
fi
verdict "uraid degraded-grow-4to5 finished by linux" md8 "$sum_h" 5 65536 H 1
verdict "uraid shrink-4to3 (backwards, after --array-size) finished by linux" md9 "$sum_i" 3 65536 I 1
verdict "uraid raid0-chunk-64to128 (a raid4 mid-reshape) finished by linux" md10 "$sum_j" 4 131072 J 1
if [ "$(grep -m1 "^md10 back " <<<"$out2")" != "md10 back level=raid0 disks=3 chunk=131072" ] ||
    [ "$(grep -m1 "^J0 " <<<"$out2" | cut -d' ' -f2)" != "$sum_j" ]; then
    echo "FAIL reshape uraid raid0-chunk-64to128: Linux's takeover back to raid0: $(grep -m1 "^md10 back " <<<"$out2"), $(grep -m1 "^J0 " <<<"$out2")"
    tail -30 <<<"$out2"; fail=1
else
    echo "PASS reshape uraid raid0-chunk-64to128: mdadm --grow --level=0 took Linux's finished raid4 back to a raid0 of 3 with a 128K chunk and the same bytes"
fi
verdict "uraid-finished raid5-to-raid6-4to5 read by linux" md11 "$sum_s" 5 65536 S 0
if [ "$(grep -m1 "^md11 shape " <<<"$out2")" != "md11 shape level=raid6 layout=2" ]; then
    echo "FAIL reshape uraid-finished raid5-to-raid6-4to5: Linux sees $(grep -m1 "^md11 shape " <<<"$out2"), want raid6 layout 2 (left-symmetric)"
    fail=1
else
    echo "PASS reshape uraid-finished raid5-to-raid6-4to5 (shape): Linux sees raid6, layout 2 (left-symmetric)"
fi
verdict "uraid raid0-shrink-3to2 (a raid4 of 4 -> 3 mid-reshape) finished by linux" md12 "$sum_k" 3 65536 K 1
# Linux's raid0 of 2, read by uraid with the device that left offered too: md wrote that
# device's role as removed (0xffff) and its own superblock is a raid4 member's, behind;
# md's raid0 keeps no spares, so uraid leaves it out.
back_k="$(grep -m1 "^md12 back " <<<"$out2" || true)"
det_k="$("$URAID" detail --json k0 k1 k2 2>/dev/null | python3 -c 'import json,sys
d = json.load(sys.stdin); print(d["level"], d["raid_disks"], len(d["members"]))' 2>/dev/null || true)"
if [ "$back_k" != "md12 back level=raid0 disks=2" ] ||
    [ "$(grep -m1 "^K0 " <<<"$out2" | cut -d' ' -f2)" != "$sum_k" ] ||
    [ "$det_k" != "raid0 2 2" ] || [ "$(prefix_sum "$keep_k" k0 k1 k2)" != "$sum_k" ]; then
    echo "FAIL reshape uraid raid0-shrink-3to2: Linux's takeover to raid0: '$back_k', $(grep -m1 "^K0 " <<<"$out2"); uraid then: '$det_k'"
    "$URAID" detail k0 k1 k2; tail -30 <<<"$out2"; fail=1
else
    echo "PASS reshape uraid raid0-shrink-3to2: mdadm --grow --level=0 took Linux's finished raid4 of 3 to a raid0 of 2 with the kept bytes; uraid reads it so with the departed parity member offered (left out)"
fi
sv_verdict || fail=1
fi # RESHAPE_ONLY
# A 0.90 raid5 Linux md left mid-grow (issue 15, md's 0.91 record): in a third boot mdadm
# creates a 0.90 raid5 on 3 members, fills it and records its sha256, grows it to 4 with a
# backup file (0.90 cannot move its data offset, so md grows it in place) at a low speed, and
# stops it past the critical section. On the host, uraid examine shows mdadm's reshape
# position, uraid read gives the sha256, uraid grow --continue finishes it (4 devices, 0.90
# records again, parity consistent); in a fourth boot Linux md assembles the result,
# `echo check` finds 0 mismatches and the sha256 reads back. Its own block: merge-friendly.
# A second such array (SV91, md1 in the third boot) is served: sv_host serves it read-write
# under fio while the reshape goes on (it reads the SV91-* lines of the third boot, as `out`),
# then mdadm --examine must show 0.90.00 records of 4 devices on every member; sv_job2 and
# sv_verdict have the fourth boot assemble it (as md3) and compare with uraid's read.
scenario_091() {
    truncate -s 16M f0 f1 f2 f3 $(sv_disks SV91)
    {
        echo "SV_OFF_MIB=$((SV_OFF >> 20)) SV_END_MIB=$((SV_END >> 20))"
        cat <<'JOB'
set -e
echo 200 > /proc/sys/dev/raid/speed_limit_min
echo 200 > /proc/sys/dev/raid/speed_limit_max
# grow091 TAG MD DEV DEV DEV SPARE: a 0.90 raid5 on 3 members filled from the pattern disk
# (TAG-SUM: its sha256 and sectors; TAG-HEAD, TAG-TAIL: those of the bytes before SV_OFF and
# from SV_END on), grown to 4 with a backup file and stopped mid-way (TAG-STOPPED).
grow091() {
    tag=$1 md=$2; shift 2
    mdadm --create --run /dev/$md --metadata=0.90 --level=5 --layout=left-symmetric --chunk=64 \
        --raid-devices=3 --assume-clean $1 $2 $3 2>&1
    n=$(cat /sys/block/$md/size)
    dd if=/dev/disk/0 of=/dev/$md bs=512 count=$n conv=fsync 2>/dev/null
    sync; echo 3 > /proc/sys/vm/drop_caches
    echo "$tag-SUM $(sha256sum /dev/$md | cut -d' ' -f1) $n"
    echo "$tag-HEAD $(dd if=/dev/$md bs=1M count=$SV_OFF_MIB 2>/dev/null | sha256sum | cut -d' ' -f1)"
    echo "$tag-TAIL $(dd if=/dev/$md bs=1M skip=$SV_END_MIB 2>/dev/null | sha256sum | cut -d' ' -f1)"
    mdadm /dev/$md --add $4 2>&1
    if ! msg="$(mdadm --grow /dev/$md --raid-devices=4 --backup-file=/root/$md-091.bk 2>&1)"; then
        echo "$tag-GROW-REFUSED $(echo "$msg" | tr '\n' ' ')"
        mdadm --stop /dev/$md 2>&1; return 0
    fi
    echo "$msg"
    echo 200 > /sys/block/$md/md/sync_speed_min
    echo 200 > /sys/block/$md/md/sync_speed_max
    # Past the critical section (mdadm's backup file no longer holds live stripes) and short
    # of the end: reshape_position well in, sync_completed below its total.
    i=0
    while :; do
        pos="$(cat /sys/block/$md/md/reshape_position)"
        sc="$(cat /sys/block/$md/md/sync_completed)"
        case "$pos:$sc" in
        none:*|*:none) ;;
        *) [ "$pos" -ge 8192 ] && [ "${sc%% /*}" -lt "${sc##*/ }" ] && break ;;
        esac
        i=$((i + 1)); [ $i -lt 900 ] || { echo "NO-PROGRESS-091 $md $pos $sc"; cat /proc/mdstat; exit 1; }
        sleep 0.2
    done
    echo "$md (0.90) at reshape_position $pos sync_completed $sc"
    mdadm --stop /dev/$md 2>&1
    mdadm --examine $1 | grep -E "Version|Reshape|Delta|Raid Devices" || true
    echo "$tag-STOPPED"
}
grow091 F md0 /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4
grow091 SV91 md1 /dev/disk/5 /dev/disk/6 /dev/disk/7 /dev/disk/8
echo GUEST-OK
JOB
    } > job3.sh
    local rc=0 out3 out4 sv91=0
    out3="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job3.sh --boot-timeout 900 \
        --disk f0 --disk f1 --disk f2 --disk f3 $(sv_disk_args SV91) 2>&1)" || rc=$?
    if [ $rc != 0 ] || ! grep -q GUEST-OK <<<"$out3"; then
        echo "FAIL reshape 0.91 grow (guest, rc $rc):"; tail -40 <<<"$out3"; return 1
    fi
    # The 0.91 array served: sv_host reads the third boot's lines; SV_PASSED here names only
    # the arrays of this scenario (for sv_job2 and sv_verdict in the fourth boot).
    local out="$out3" SV_PASSED="" m v
    if ! mdadm --examine "$(sv_disks SV91 | cut -d' ' -f1)" 2>/dev/null | grep -q "Version : 0.91.00"; then
        echo "FAIL reshape served 0.91 grow-3to4: the stopped members are not 0.91"
        mdadm --examine "$(sv_disks SV91 | cut -d' ' -f1)"; sv91=1
    elif sv_host SV91; then
        for m in $(sv_disks SV91); do
            v="$(mdadm --examine "$m" 2>/dev/null || true)"
            if ! grep -q "Version : 0.90.00" <<<"$v" || ! grep -q "Raid Devices : 4" <<<"$v"; then
                v="$(grep -E "Version|Raid Devices|Reshape" <<<"$v" | tr -s ' ' | tr '\n' ';')"
                echo "FAIL reshape served 0.91 grow-3to4: mdadm --examine $m after the served reshape: '$v'"
                mdadm --examine "$m"; sv91=1; SV_PASSED=""
            fi
        done
        [ $sv91 != 0 ] || echo "PASS reshape served 0.91 grow-3to4 (records): mdadm --examine shows 0.90.00, 4 raid devices on every member"
    else
        sv91=1
    fi
    local sum sectors md_pos u_pos got
    sum="$(grep -m1 "^F-SUM " <<<"$out3" | cut -d' ' -f2)"
    sectors="$(grep -m1 "^F-SUM " <<<"$out3" | cut -d' ' -f3)"
    if ! mdadm --examine f0 2>/dev/null | grep -q "Version : 0.91.00"; then
        echo "FAIL reshape 0.91 grow: the stopped members are not 0.91"; mdadm --examine f0; return 1
    fi
    md_pos="$(mdadm --examine f0 2>/dev/null | grep "Reshape pos'n" | sed 's/.*: *//')"
    u_pos="$("$URAID" examine f0 2>&1 | grep "Reshape pos'n" | sed 's/.*: *//')" || true
    if [ -z "$md_pos" ] || [ "$md_pos" != "$u_pos" ]; then
        echo "FAIL reshape 0.91 grow: mdadm --examine says '$md_pos', uraid examine '$u_pos'"; return 1
    fi
    got="$("$URAID" read --length $((sectors * 512)) f0 f1 f2 f3 2>f.err | sha256sum | cut -d' ' -f1)"
    if [ "$got" != "$sum" ]; then
        echo "FAIL reshape 0.91 grow: uraid read $got mid-grow, Linux recorded $sum"; cat f.err; return 1
    fi
    if ! "$URAID" grow -q --continue f0 f1 f2 f3 >cont-f.log 2>&1; then
        echo "FAIL reshape 0.91 continue: uraid grow --continue failed"; cat cont-f.log; return 1
    fi
    if ! mdadm --examine f0 2>/dev/null | grep -q "Version : 0.90.00" ||
        ! mdadm --examine f3 2>/dev/null | grep -q "Raid Devices : 4" ||
        [ "$(prefix_sum $((sectors * 512)) f0 f1 f2 f3)" != "$sum" ] || ! parity_ok f0 f1 f2 f3; then
        echo "FAIL reshape 0.91 continue: after uraid finished the grow: records, bytes or parity differ"
        mdadm --examine f0; cat cont-f.log; return 1
    fi
    echo "PASS reshape 0.91 continue: uraid read Linux md's 0.90 grow at $md_pos and finished it (0.90, 4 devices, the sha256, parity consistent)"
    cat > job4.sh <<JOB
set -e
mdadm --assemble --run /dev/md0 /dev/disk/1 /dev/disk/2 /dev/disk/3 /dev/disk/4 2>&1
echo "at-assembly reshape_position=\$(cat /sys/block/md0/md/reshape_position) disks=\$(cat /sys/block/md0/md/raid_disks)"
echo check > /sys/block/md0/md/sync_action; sleep 0.5
mdadm --wait /dev/md0 >/dev/null 2>&1 || true
while [ "\$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
echo "MISMATCH \$(cat /sys/block/md0/md/mismatch_cnt)"
sync; echo 3 > /proc/sys/vm/drop_caches
echo "F \$(head -c $((sectors * 512)) /dev/md0 | sha256sum | cut -d' ' -f1)"
mdadm --stop /dev/md0
JOB
    { job_finish; sv_job2 5; echo "echo GUEST-OK"; } >>job4.sh
    rc=0
    out4="$(python3 "$HERE/harness.py" --uraid "$URAID" --script job4.sh --boot-timeout 900 \
        --disk f0 --disk f1 --disk f2 --disk f3 $(sv_disk_args $SV_PASSED) 2>&1)" || rc=$?
    if [ $rc != 0 ] || ! grep -q GUEST-OK <<<"$out4"; then
        echo "FAIL reshape 0.91 read by linux (guest, rc $rc):"; tail -40 <<<"$out4"; return 1
    fi
    if ! grep -q "^at-assembly reshape_position=none disks=4" <<<"$out4" ||
        ! grep -q "^MISMATCH 0$" <<<"$out4" || [ "$(grep -m1 "^F " <<<"$out4" | cut -d' ' -f2)" != "$sum" ]; then
        echo "FAIL reshape 0.91 read by linux:"; tail -30 <<<"$out4"; return 1
    fi
    echo "PASS reshape 0.91 finished by uraid, read by linux (4 devices, no reshape left, check 0 mismatches, the sha256)"
    local out2="$out4"
    sv_verdict || sv91=1
    return $sv91
}
scenario_091 || fail=1
exit $fail
