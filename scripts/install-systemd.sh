#!/bin/sh
# Installs uraid's systemd unit (and with --udev the incremental-assembly udev rule):
#   sudo scripts/install-systemd.sh [--prefix /usr/local] [--udev] [--dest DIR]
# The binary is copied to PREFIX/bin; the unit's ExecStart is rewritten to point there.
# --dest installs under DIR (a staging root, for packaging), without reloading systemd.
set -eu
prefix=/usr/local
udev=0
dest=
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --udev) udev=1; shift ;;
        --dest) dest=$2; shift 2 ;;
        -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
        *) echo "install-systemd.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/target/release/uraid
[ -x "$bin" ] || bin=$here/target/debug/uraid
if [ ! -x "$bin" ]; then
    echo "install-systemd.sh: no uraid binary: run cargo build --release -p uraid first" >&2
    exit 1
fi
install -D -m 0755 "$bin" "$dest$prefix/bin/uraid"
unitdir=$dest/etc/systemd/system
mkdir -p "$unitdir"
sed "s|/usr/local/bin/uraid|$prefix/bin/uraid|g" "$here/contrib/systemd/uraid@.service" \
    > "$unitdir/uraid@.service"
chmod 0644 "$unitdir/uraid@.service"
install -m 0644 "$here/contrib/systemd/uraid@.socket" "$unitdir/uraid@.socket"
mkdir -p "$dest/etc/uraid"
if [ "$udev" = 1 ]; then
    mkdir -p "$dest/etc/udev/rules.d"
    sed "s|/usr/local/bin/uraid|$prefix/bin/uraid|g" \
        "$here/contrib/udev/65-uraid-incremental.rules" \
        > "$dest/etc/udev/rules.d/65-uraid-incremental.rules"
fi
if [ -z "$dest" ]; then
    systemctl daemon-reload
    [ "$udev" = 1 ] && udevadm control --reload
fi
echo "installed $prefix/bin/uraid, uraid@.service and uraid@.socket; start an array with:"
echo "  systemctl enable --now uraid@md0"
