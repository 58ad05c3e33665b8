#!/bin/sh
# /init of the test VM (busybox). Loads the modules, mounts the host's 9p share at /share,
# names the attached disks and runs /share/job.sh. Everything the host needs comes back
# through /share/out; the serial console only carries progress markers.
#
# Disks: the host attaches member images as virtio-scsi disks with scsi-id N; they appear
# here as /dev/sdX in whatever order the scan finishes, so this script links
# /dev/disk/N -> /dev/sdX by scsi id. The host writes the expected count to /share/ndisks.
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/disk /tmp
mount -t tmpfs tmp /tmp

echo "@@VM boot $(cut -d' ' -f1 /proc/uptime)"
while read -r m; do
    insmod "/lib/modules/$(uname -r)/$m" 2>/tmp/insmod.err \
        || echo "@@VM insmod $m failed: $(cat /tmp/insmod.err)"
done </etc/modules.load

mkdir -p /share
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share; then
    echo "@@VM cannot mount 9p share"
    poweroff -f
fi
mkdir -p /share/out

want=$(cat /share/ndisks 2>/dev/null || echo 0)
i=0
while :; do
    n=0
    for b in /sys/block/sd*; do
        [ -e "$b" ] && n=$((n + 1))
    done
    [ "$n" -ge "$want" ] && break
    i=$((i + 1))
    if [ "$i" -gt 300 ]; then
        echo "@@VM only $n of $want disks appeared"
        break
    fi
    sleep 0.1
done
for b in /sys/block/sd*; do
    [ -e "$b" ] || continue
    hctl=$(basename "$(readlink "$b/device")")
    id=$(echo "$hctl" | cut -d: -f3)
    ln -sf "/dev/$(basename "$b")" "/dev/disk/$id"
done

echo "@@VM ready $(cut -d' ' -f1 /proc/uptime)"
cd /tmp
sh /share/job.sh >/share/out/job.log 2>&1
echo "$?" >/share/out/job.rc
dmesg >/share/out/dmesg.txt
sync
echo "@@VM done $(cut -d' ' -f1 /proc/uptime) rc=$(cat /share/out/job.rc)"
umount /share
poweroff -f
