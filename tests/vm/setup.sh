#!/usr/bin/env bash
# Prepare everything the Linux interoperability VM needs, from a fresh Debian 12 machine.
#
#   tests/vm/setup.sh            # install packages, fetch the kernel, build the base initramfs
#
# Idempotent: a second run only checks stamps and returns in well under a second.
# Everything lands in tests/vm/.cache (git-ignored):
#   deb/            the pinned linux-image-*-amd64-unsigned package
#   kpkg/           that package unpacked (dpkg -x)
#   vmlinuz         the kernel to boot
#   root/           the initramfs tree (busybox, modules, mdadm, e2fsprogs, /init)
#   base.cpio.gz    root/ packed; run-time files come in over virtio-9p, so it never changes per run
#   kver            the kernel release string
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="$HERE/.cache"
# The kernel we test with. Debian's security archive drops old point releases, so fall back
# to the newest 6.12 amd64-unsigned image that apt knows about when the pin is gone.
PIN_PKG="linux-image-6.12.111+deb12-amd64-unsigned"
# Bump when the contents of the initramfs change, so that old caches are rebuilt.
ROOT_VERSION=3

log() { echo "setup: $*" >&2; }

wait_dpkg_lock() {
    local waited=0
    while fuser /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock \
        >/dev/null 2>&1; do
        if ((waited == 0)); then log "waiting for another apt/dpkg to finish"; fi
        sleep 3
        waited=$((waited + 3))
        if ((waited > 900)); then
            log "dpkg lock still held after 15 minutes"
            return 1
        fi
    done
}

install_packages() {
    local need=()
    local pkg
    for pkg in qemu-system-x86 mdadm busybox-static cpio xz-utils e2fsprogs kmod psmisc; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || need+=("$pkg")
    done
    ((${#need[@]} == 0)) && return 0
    log "installing ${need[*]}"
    command -v fuser >/dev/null && wait_dpkg_lock
    export DEBIAN_FRONTEND=noninteractive
    # DPkg::Lock::Timeout covers a machine without fuser (psmisc) yet.
    apt-get -o DPkg::Lock::Timeout=900 update -qq || true
    command -v fuser >/dev/null && wait_dpkg_lock
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need[@]}"
}

fetch_kernel() {
    mkdir -p "$CACHE/deb"
    if ls "$CACHE"/deb/linux-image-*.deb >/dev/null 2>&1; then return 0; fi
    local pkg="$PIN_PKG"
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
        pkg="$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64-unsigned$' \
            | awk '{print $1}' | sort -V | tail -n1)"
        [[ -n "$pkg" ]] || { log "no linux-image-6.12.*-amd64-unsigned package known to apt"; exit 1; }
        log "pinned $PIN_PKG is gone; using $pkg"
    fi
    log "downloading $pkg"
    (cd "$CACHE/deb" && apt-get download "$pkg" 2>&1 | grep -v 'unsandboxed' >&2) || true
    ls "$CACHE"/deb/linux-image-*.deb >/dev/null 2>&1 || { log "download of $pkg failed"; exit 1; }
}

unpack_kernel() {
    if [[ -f "$CACHE/kpkg/.done" ]]; then return 0; fi
    log "unpacking kernel package"
    rm -rf "$CACHE/kpkg"
    mkdir -p "$CACHE/kpkg"
    dpkg -x "$(ls "$CACHE"/deb/linux-image-*.deb | head -n1)" "$CACHE/kpkg"
    local kver
    kver="$(ls "$CACHE/kpkg/lib/modules" | head -n1)"
    # The package ships no modules.dep (postinst makes it); we need it to resolve dependencies.
    depmod -b "$CACHE/kpkg" "$kver"
    cp "$CACHE/kpkg/boot/vmlinuz-$kver" "$CACHE/vmlinuz"
    echo "$kver" >"$CACHE/kver"
    touch "$CACHE/kpkg/.done"
}

# Modules the guest loads, in this order (each pulls its dependencies first).
# crc32c must be there before libcrc32c, or raid456 fails with "unknown symbol".
MODULES=(crc32c_generic crc32c-intel libcrc32c
    md-mod raid0 raid1 raid10 raid456
    virtio_blk virtio_scsi sd_mod loop nbd ublk_drv
    crc16 mbcache jbd2 ext4
    9pnet_virtio 9p)

# Copy a host executable and the libraries ldd lists into the tree at the same paths.
copy_binary() {
    local root="$1" bin="$2" dest="${3:-$2}"
    mkdir -p "$root/$(dirname "$dest")"
    cp -L "$bin" "$root/$dest"
    local lib
    for lib in $(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [[ -e "$root$lib" ]] && continue
        mkdir -p "$root/$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

build_root() {
    local stamp="$CACHE/root.stamp"
    local want="v$ROOT_VERSION $(cat "$CACHE/kver") $(md5sum "$HERE/guest-init.sh" | cut -c1-32)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f "$CACHE/base.cpio.gz" ]]; then
        return 0
    fi
    log "building initramfs"
    local kver root="$CACHE/root"
    kver="$(cat "$CACHE/kver")"
    rm -rf "$root"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,proc,sys,dev,tmp,run,mnt,share,etc}
    cp /usr/bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/usr/bin/busybox --list); do
        [[ -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
    done

    # Modules: resolve with the host's modprobe against the unpacked tree, decompress, depmod.
    local kmods="$CACHE/kpkg/lib/modules/$kver" order=() line path rel
    while read -r line; do
        path="$(awk '{print $2}' <<<"$line")"
        rel="${path#"$kmods"/}"
        rel="${rel%.xz}"
        if [[ ! -f "$root/lib/modules/$kver/$rel" ]]; then
            mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
            xz -dc "$path" >"$root/lib/modules/$kver/$rel"
            order+=("$rel")
        fi
    done < <(for m in "${MODULES[@]}"; do
        modprobe -d "$CACHE/kpkg" -S "$kver" --show-depends "$m" | grep '^insmod'
    done)
    cp "$kmods"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
    depmod -b "$root" "$kver"
    printf '%s\n' "${order[@]}" >"$root/etc/modules.load"

    copy_binary "$root" /usr/sbin/mdadm /sbin/mdadm
    copy_binary "$root" /usr/sbin/mke2fs /sbin/mke2fs
    copy_binary "$root" /usr/sbin/e2fsck /sbin/e2fsck
    ln -sf mke2fs "$root/sbin/mkfs.ext4"
    ln -sf e2fsck "$root/sbin/fsck.ext4"
    # busybox's mke2fs would shadow the real one through /bin in PATH order; remove it.
    rm -f "$root/bin/mke2fs"
    cp /etc/mke2fs.conf "$root/etc/" 2>/dev/null || true
    # mdadm wants a config file, or it scans everything; keep it quiet and explicit.
    printf 'DEVICE partitions\nCREATE metadata=1.2\nHOMEHOST <ignore>\n' >"$root/etc/mdadm.conf"
    mkdir -p "$root/etc/mdadm"
    cp "$root/etc/mdadm.conf" "$root/etc/mdadm/mdadm.conf"
    echo 'root:x:0:0:root:/:/bin/sh' >"$root/etc/passwd"
    install -m 0755 "$HERE/guest-init.sh" "$root/init"

    (cd "$root" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) \
        | gzip -1 >"$CACHE/base.cpio.gz.tmp"
    mv "$CACHE/base.cpio.gz.tmp" "$CACHE/base.cpio.gz"
    echo "$want" >"$stamp"
    log "initramfs $(du -h "$CACHE/base.cpio.gz" | cut -f1)"
}

main() {
    mkdir -p "$CACHE"
    install_packages
    fetch_kernel
    unpack_kernel
    build_root
}

main "$@"
