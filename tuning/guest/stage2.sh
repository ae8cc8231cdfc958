#!/bin/bash
# The guest's stage 2, in the host's root (read-only 9p with a RAM overlay): mount what a cgroup v2 host
# has, bring up the loopback-only network, name the scratch disk as EC2 names it, run the one command the host
# put in the share, hand back its output and exit code, and power off. Never returns.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
log() { echo "iobatch-guest: $*" > /dev/console; }
poweroff_now() { sync; echo o > /proc/sysrq-trigger; sleep 10; }
trap poweroff_now EXIT

mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
# /run is the guest's own (a host's lab state there is not the guest's); /tmp and /var/tmp stay the overlay's, so
# a checkout or a test's files under them are seen at their paths, and what the guest writes there stays in RAM.
mount -t tmpfs -o mode=0755 tmpfs /run
# Enable every controller down the tree, as a systemd host with Delegate=yes does for its containers.
controllers=$(cat /sys/fs/cgroup/cgroup.controllers)
for c in $controllers; do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; done

release=$(uname -r)
mkdir -p "/lib/modules/$release"
mount --bind "$IOBATCH_MODULES" "/lib/modules/$release"

mkdir -p "$IOBATCH_SHARE"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none share "$IOBATCH_SHARE" || { log "no share"; exit 1; }
control="$IOBATCH_SHARE/.guest"

ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
  ip link set eth0 up
  ip addr add "$IOBATCH_GUEST_IP" dev eth0
fi
hostname iobatch-guest

# EC2 names the launch template's scratch volume /dev/xvdb (a udev link on AL2023); here it is the virtio disk whose
# serial is the scratch disk's.
for disk in /sys/block/vd*; do
  [ -e "$disk/serial" ] || continue
  if [ "$(cat "$disk/serial")" = "iobatch-scratch" ]; then ln -sf "/dev/$(basename "$disk")" /dev/xvdb; fi
done

echo "booted $(date +%s.%N)" > "$control/booted"
cd "$IOBATCH_SHARE"
set -a
# shellcheck disable=SC1091
[ -f "$control/env" ] && . "$control/env"
set +a
bash "$control/command" > "$control/stdout" 2> "$control/stderr" < /dev/null
echo $? > "$control/rc.tmp"
sync
mv "$control/rc.tmp" "$control/rc"
