/**
 * The machine's init, in two stages and without systemd. Stage one is a busybox script in the
 * initramfs: it loads the virtio modules, mounts the root disk (the base behind a copy-on-write
 * overlay) and the workspace disk, configures the network (interfaces live in the kernel, so they
 * survive the root switch), installs the machine's keys and mounts the API filesystems under the
 * new root. Stage two runs as pid 1 in the base's own `/bin/sh`: it keeps sshd running, and since
 * a shell waiting in the foreground reaps every child, orphaned processes do not pile up as zombies.
 */
import { guestSshdConfig } from "../MachineDriver.ts"
import { newc } from "./Cpio.ts"

/** Modules the initramfs loads, in this order (each after the modules it depends on). */
export const modules = [
  "virtio_ring",
  "virtio",
  "virtio_mmio",
  "virtio_blk",
  "failover",
  "net_failover",
  "virtio_net",
] as const

/** What the probe init prints on the console when the kernel came up. */
export const PROBE_MARK = "hangar-probe-ok"

/** The guest's address on QEMU's user network, where the SSH port is forwarded to. */
export const GUEST_ADDRESS = "10.0.2.15"

/** How the guest's `eth0` is addressed: `<address>/<prefix>` and the gateway. */
export interface GuestNet {
  readonly address: string
  readonly prefix: number
  readonly gateway: string
}

/** QEMU's user network (tests): the fixed guest address and QEMU's host side. */
export const userNet: GuestNet = { address: GUEST_ADDRESS, prefix: 24, gateway: "10.0.2.2" }

/** The kernel command line words that give the init the guest's network. */
export const netArgs = (n: GuestNet): ReadonlyArray<string> => [
  `hangar.ip=${n.address}/${n.prefix}`,
  `hangar.gw=${n.gateway}`,
]

const stage2 = `echo -1000 > /proc/self/oom_score_adj 2>/dev/null
while :; do /usr/sbin/sshd -D -e -f /etc/ssh/hangar_sshd_config; echo "hangar-init: sshd exited $?"; sleep 1; done`

/** The stage-one `/init` of the shared initramfs. */
export const initScript = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "hangar-init: $*"; poweroff -f; sleep 5; }
case " $(cat /proc/cmdline) " in *" hangar.probe "*) echo "${PROBE_MARK}"; poweroff -f; sleep 5;; esac
for m in ${modules.join(" ")}; do insmod /lib/modules/$m.ko || fail "insmod $m"; done
# Disks are found by the serial the driver gave them, not by discovery order.
dev_of() { for s in /sys/block/vd*; do [ "$(cat $s/serial 2>/dev/null)" = "$1" ] && { echo /dev/\${s##*/}; return 0; }; done; return 1; }
i=0; while ! dev_of root >/dev/null || ! dev_of workspace >/dev/null; do i=$((i+1)); [ $i -gt 1500 ] && fail "disks not found"; sleep 0.02; done
mount -t ext4 "$(dev_of root)" /newroot || fail "mount root"
mkdir -p /newroot/workspace
mount -t ext4 "$(dev_of workspace)" /newroot/workspace || fail "mount workspace"
# Every machine starts with an empty input and output folder, agent or not.
mkdir -p /newroot/workspace/in /newroot/workspace/out
hostname machine
for w in $(cat /proc/cmdline); do case "$w" in hangar.ip=*) ip_cidr=\${w#hangar.ip=};; hangar.gw=*) gw=\${w#hangar.gw=};; esac; done
[ -n "$ip_cidr" ] && [ -n "$gw" ] || fail "no hangar.ip or hangar.gw on the kernel command line"
ip link set lo up && ip link set eth0 up && ip addr add $ip_cidr dev eth0 && ip route add default via $gw || fail "network"
mkdir -p /newroot/etc/ssh
cp /hangar/sshd_config /newroot/etc/ssh/hangar_sshd_config
cp /hangar/authorized_keys /newroot/etc/ssh/hangar_authorized_keys
cp /hangar/host_key /newroot/etc/ssh/hangar_host_key && chmod 600 /newroot/etc/ssh/hangar_host_key || fail "keys"
mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/run/sshd
chmod 1777 /newroot/tmp
# Commands run in memory cgroups (v1) below this one, as in every Hangar machine.
mount -t tmpfs -o mode=755 cgroup /newroot/sys/fs/cgroup
mkdir -p /newroot/sys/fs/cgroup/memory
mount -t cgroup -o memory memory /newroot/sys/fs/cgroup/memory || fail "memory cgroup"
umount /proc /sys /dev
exec switch_root -c /dev/console /newroot /bin/sh -c '${stage2}'
`

/** The per-machine archive appended to the shared initramfs: sshd's config and the machine's keys. */
export const configArchive = (hostKey: string, authorizedKey: string, listenAddress: string): Buffer =>
  newc([
    { type: "dir", path: "hangar", mode: 0o700 },
    { type: "file", path: "hangar/sshd_config", data: Buffer.from(guestSshdConfig(listenAddress)) },
    { type: "file", path: "hangar/authorized_keys", data: Buffer.from(`${authorizedKey.trim()}\n`) },
    { type: "file", path: "hangar/host_key", data: Buffer.from(hostKey), mode: 0o600 },
  ])
