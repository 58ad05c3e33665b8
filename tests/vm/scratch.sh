# Sourced by the VM suites: `W="$(vm_scratch NAME NEED_MIB)"` makes a new folder for a
# suite's member images, NEED_MIB of them once written. It is made in $TMPDIR (/tmp) when
# that file system keeps a gigabyte free beside them, else in /dev/shm (memory) when that
# does; else it says how much is missing where and fails. CI machines have been seen with
# under a gigabyte of disk free; tests/vm/harness.py's image_dir does the same for its boots.
vm_scratch() { # NAME NEED_MIB
    local name=$1 need=$2 spare=1024 base free report=""
    for base in "${TMPDIR:-/tmp}" /dev/shm; do
        [ -d "$base" ] && [ -w "$base" ] || continue
        free=$(df -Pm "$base" | awk 'NR == 2 { print $4 }')
        report+="${report:+, }${free:-?} MiB free in $base"
        if [ "${free:-0}" -ge $((need + spare)) ]; then
            [ "$base" = "${TMPDIR:-/tmp}" ] ||
                echo "[$name] too little disk free (${report%%,*}): member images in memory, $base" >&2
            mktemp -d "$base/uraid-$name.XXXXXX"
            return 0
        fi
    done
    echo "FAIL $name: no room for $need MiB of member images and $spare MiB spare ($report);" \
         "free disk space (an old target/ or tests/vm/.cache/runs/) and run again" >&2
    return 1
}
