#!/bin/busybox sh
# The guest's first process (the project's initramfs): load the modules a 9p root needs, mount the host's `/`
# read-only with a RAM overlay on top, and hand over to stage 2 (tuning/guest/stage2.sh) in that root.
# IOBATCH_STAGE2 and the other settings come from the kernel command line (tuning/guest/qemu.py).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "iobatch-guest: $*"; echo o > /proc/sysrq-trigger; sleep 5; }
while read -r module; do
  insmod "/modules/$module" 2>/dev/null || echo "iobatch-guest: insmod $module failed (built in?)"
done < /modules/order
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower || fail "no 9p root"
mount -t tmpfs -o mode=0755 tmpfs /upper
mkdir -p /upper/rw /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/rw,workdir=/upper/work /newroot || fail "no overlay"
for dir in proc sys dev; do mount --move "/$dir" "/newroot/$dir"; done
[ -x "/newroot$IOBATCH_STAGE2" ] || fail "stage 2 $IOBATCH_STAGE2 is not in the root"
exec switch_root /newroot "$IOBATCH_STAGE2"
