#!/bin/sh
# PID 1 of the cgroup v2 test VM (boot.sh): the host's / is its root, read-only. Mounts a pure cgroup v2 hierarchy,
# the kernel filesystems, tmpfs and an ext4 /tmp where programs write, points the kernel's module loader at the VM
# kernel's modules, gives itself an uplink that goes nowhere (for pasta), puts itself in a delegated cgroup (as systemd's
# Delegate=yes gives a service), runs the out folder's command.sh with its output in output.log and exit status in rc,
# and halts.
out=${orchard_out:?no orchard_out= on the kernel command line}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
ln -sf /proc/self/fd /dev/fd
repo=$(cd "$(dirname "$0")/../.." && pwd)  # the checkout this init is in: before the mounts below hide it
for dir in /run /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$dir"; done
mkdir -p /run/out /run/modules/lib /run/disk
mount -t hostfs -o "$out" none /run/out
# The VM kernel's modules (overlay, loop, veth, nf_tables ...) are in the user-mode-linux package, not under the
# root's /lib/modules: the kernel's loader runs modprobe on that tree.
ln -s /usr/lib/uml/modules /run/modules/lib/modules
printf '#!/bin/sh\nexec /sbin/modprobe -d /run/modules "$@"\n' > /run/modprobe
chmod 755 /run/modprobe
echo /run/modprobe > /proc/sys/kernel/modprobe
/run/modprobe loop  # its device nodes appear once it is loaded
/run/modprobe tun  # /dev/net/tun, for pasta
# Legacy iptables' modules for rootless allowlists (root's iptables loads them itself; an unprivileged user's cannot),
# as a host's /etc/modules-load.d would: iptables.MODULES.
for module in ip_tables iptable_filter ip6_tables ip6table_filter xt_conntrack ipt_REJECT ip6t_REJECT; do
  /run/modprobe "$module"
done
# /tmp is ext4 in memory (a file on a tmpfs; discard gives freed blocks back): this kernel's tmpfs has no user.*
# xattrs (they came in 6.6), which a rootless sandbox's writable layer needs.
mount -t tmpfs -o size=2G tmpfs /run/disk
truncate -s 2G /run/disk/tmp.img && mkfs.ext4 -q /run/disk/tmp.img && mount -o loop,discard /run/disk/tmp.img /tmp
chmod 1777 /tmp
# A checkout under /tmp (a clone there, as CI may make) is shown again, read-only like the rest.
if [ ! -d "$repo/scripts/vm" ]; then mkdir -p "$repo" && mount -r -t hostfs -o "$repo" none "$repo"; fi
hostname orchard-vm
ip link set lo up
# An uplink that goes nowhere (a dummy device with the default route), as a host has one: pasta copies the addresses
# and routes of the host's outbound interface into a rootless sandbox's namespace, and refuses to start without one.
/run/modprobe dummy
ip link add uplink type dummy && ip addr add 10.0.2.15/24 dev uplink && ip link set uplink up
ip route add default via 10.0.2.2 dev uplink
echo "+memory +cpu +pids" > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/delegated
echo $$ > /sys/fs/cgroup/delegated/cgroup.procs
echo "guest: up after $(cut -d' ' -f1 /proc/uptime) s"
cd /run/out && PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin sh ./command.sh > output.log 2>&1
echo $? > /run/out/rc
echo "guest: done after $(cut -d' ' -f1 /proc/uptime) s"
cd / && umount /run/out
echo o > /proc/sysrq-trigger  # power off (no systemd needed)
sleep 30  # the power-off is asynchronous: PID 1 must not exit first (a panic)
