# Shell helpers for the jobs that harness.py writes; sourced by /share/job.sh in the guest.
# The pattern disk (seeded bytes from the host, read-only) is scsi id 0, members follow.
# Each array gets a folder /share/out/NAME with:
#   log       every command and its output
#   result    key=value lines (size, sha256 at named points, mismatch_cnt, ...)
#   failed    the step that failed, if one did
#   dmesg     the kernel log tail, when a step failed
# A step that fails makes the rest of that array's steps no-ops, so one broken array
# does not stop the others in the same boot.

PAT=/dev/disk/0

mark() { echo "@@ $(cut -d" " -f1 /proc/uptime) $*" >/dev/ttyS0; }

begin() {
    NAME=$1
    D=/share/out/$NAME
    mkdir -p "$D"
    : >"$D/log"
    : >"$D/result"
    FAILED=
    # A step that failed leaves SIZE unset; later steps still expand it (then return).
    SIZE=0
    mark "begin $NAME"
}

# run STEP CMD...: run CMD, log it, remember STEP as the failure if it fails.
run() {
    [ -n "$FAILED" ] && return 1
    _step=$1
    shift
    echo "+ [$_step] $*" >>"$D/log"
    if ! "$@" >>"$D/log" 2>&1; then
        fail "$_step"
        return 1
    fi
}

fail() {
    [ -n "$FAILED" ] && return 1
    FAILED=$1
    echo "$1" >"$D/failed"
    echo "!! step $1 failed" >>"$D/log"
    return 1
}

rec() { echo "$1=$2" >>"$D/result"; }

# put SRC_DEV SRC_OFF DST_DEV DST_OFF LEN: copy bytes with the largest block size that fits.
put() {
    _bs=1048576
    while [ $(($2 % _bs)) -ne 0 ] || [ $(($4 % _bs)) -ne 0 ] || [ $(($5 % _bs)) -ne 0 ]; do
        _bs=$((_bs / 2))
    done
    dd if="$1" of="$3" bs=$_bs skip=$(($2 / _bs)) seek=$(($4 / _bs)) count=$(($5 / _bs)) \
        conv=notrunc 2>/tmp/dd.err
    _rc=$?
    grep -v 'records\|copied' /tmp/dd.err
    return $_rc
}

# Flush and drop caches, so that the next read comes from the member disks.
settle() {
    sync
    blockdev --flushbufs /dev/md0 2>/dev/null
    echo 3 >/proc/sys/vm/drop_caches
}

# sha KEY: sha256 of the whole of /dev/md0, recorded under KEY.
sha() {
    [ -n "$FAILED" ] && return 1
    settle
    _s=$(sha256sum /dev/md0 | cut -d' ' -f1) || { fail "sha-$1"; return 1; }
    rec "$1" "$_s"
}

size() {
    [ -n "$FAILED" ] && return 1
    _z=$(blockdev --getsize64 /dev/md0) || { fail size; return 1; }
    rec size "$_z"
    SIZE=$_z
}

# snap TAG: keep /proc/mdstat, sync_action and mdadm --detail for the host to check.
snap() {
    [ -n "$FAILED" ] && return 1
    cat /proc/mdstat >"$D/mdstat.$1"
    cat /sys/block/md0/md/sync_action >"$D/sync_action.$1" 2>/dev/null
    mdadm --detail /dev/md0 >"$D/detail.$1" 2>&1
}

# check_parity: run md's "check" and record mismatch_cnt (0 when parity/mirrors agree).
check_parity() {
    [ -n "$FAILED" ] && return 1
    echo check >/sys/block/md0/md/sync_action || { fail check; return 1; }
    sleep 0.2
    mdadm --wait /dev/md0 >/dev/null 2>&1
    while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
    rec mismatch_cnt "$(cat /sys/block/md0/md/mismatch_cnt)"
}

wait_sync() {
    [ -n "$FAILED" ] && return 1
    mdadm --wait /dev/md0 >/dev/null 2>&1
    while [ -e /sys/block/md0/md/sync_action ] &&
        [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
    return 0
}

finish() {
    if [ -e /sys/block/md0 ]; then
        mdadm --detail /dev/md0 >"$D/detail.end" 2>&1
        echo "+ mdadm --stop /dev/md0" >>"$D/log"
        mdadm --stop /dev/md0 >>"$D/log" 2>&1 || fail stop
    fi
    if [ -n "$FAILED" ]; then
        dmesg | tail -n 40 >"$D/dmesg"
    fi
    echo "done=${FAILED:-ok}" >>"$D/result"
    mark "end $NAME ${FAILED:-ok}"
}
