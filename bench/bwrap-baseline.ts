/**
 * The namespace driver as it was before machines became unprivileged tenants: bwrap in pid, uts,
 * ipc and mount namespaces, with the host's root and every capability, its overlay's upper layer on
 * the host's disk. It is kept here only as the baseline `bench/machines.ts` prints beside the
 * crun driver's figures, so the cost of the isolation is measured in the same run. Never use it for
 * a run: its root is root on the host.
 */
import { spawn } from "node:child_process"
import { closeSync, openSync } from "node:fs"
import * as fs from "node:fs/promises"
import { connect } from "node:net"
import { join } from "node:path"
import { Effect } from "effect"
import ssh2 from "ssh2"
import {
  guestSshdConfig,
  limitsOf,
  MachineCreateFailed,
  MachineDestroyFailed,
  type MachineDriverService,
  type MachineSpec,
} from "../host-agent/machines/MachineDriver.ts"
import * as Cgroups from "../host-agent/machines/namespace/Cgroups.ts"
import { run } from "../host-agent/machines/namespace/exec.ts"
import { NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import * as Net from "../host-agent/machines/namespace/Net.ts"
import * as Disks from "../host-agent/machines/qemu/Disks.ts"
import * as Policy from "../host-agent/network/Policy.ts"

const s = { ...NamespaceDriverSettings.defaults, machinesDir: "/var/lib/hangar/bench-bwrap" }
const policy = Policy.PolicySettings.defaults

const launcher = `
set -e
for g in $HG_CGROUPS; do echo $$ > "$g/cgroup.procs"; done
exec nsenter --net="/run/netns/$HG_NETNS" unshare --mount --propagation private /bin/sh -c '
set -e
umount -l /run/netns 2>/dev/null || true
mount -t overlay overlay -o "lowerdir=$HG_BASE,upperdir=$HG_DIR/upper,workdir=$HG_DIR/work" "$HG_DIR/root"
mount -o loop "$HG_DIR/workspace.img" "$HG_DIR/root/workspace"
mkdir -p "$HG_DIR/root/run/sshd" "$HG_DIR/root/sys/fs/cgroup/memory"
exec bwrap --bind "$HG_DIR/root" / --dev /dev --proc /proc --bind "$HG_GUEST_CGROUP" /sys/fs/cgroup/memory \\
  --unshare-pid --unshare-uts --unshare-ipc --hostname machine -- /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
'
`

const tcpOpen = (host: string) =>
  new Promise<boolean>((ok) => {
    const socket = connect({ host, port: 22 })
    socket.once("connect", () => {
      socket.destroy()
      ok(true)
    })
    socket.once("error", () => ok(false))
  })

const destroyNow = async (id: string) => {
  const dir = join(s.machinesDir, id)
  await Cgroups.killAll(s.cgroupRoot, id, s.termGraceMs)
  for (const dev of (await run("losetup", ["-n", "-O", "NAME", "-j", join(dir, "workspace.img")]))
    .split("\n")
    .filter((l) => l.trim()))
    await run("losetup", ["-d", dev.trim()]).catch(() => undefined)
  await Cgroups.remove(s.cgroupRoot, id)
  await Policy.detach(policy, Net.hostIfOf(id))
  await Net.down(id)
  await Net.release(s.runDir, id)
  await fs.rm(dir, { recursive: true, force: true })
}

const createNow = async (spec: MachineSpec) => {
  const limits = limitsOf(spec)
  const dir = join(s.machinesDir, spec.id)
  for (const d of ["upper/etc/ssh", "work", "root"]) await fs.mkdir(join(dir, d), { recursive: true })
  const net = await Net.lease(s.runDir, s.addressPool, spec.id)
  await Net.up(net)
  await Policy.attach(policy, { iface: net.hostIf, guestAddress: net.guestAddress })
  const hostKey = ssh2.utils.parseKey(spec.hostKey)
  if (hostKey instanceof Error) throw hostKey
  await fs.writeFile(join(dir, "upper/etc/ssh/hangar_host_key"), spec.hostKey, { mode: 0o600 })
  await fs.writeFile(join(dir, "upper/etc/ssh/hangar_authorized_keys"), `${spec.authorizedKey.trim()}\n`)
  await fs.writeFile(join(dir, "upper/etc/ssh/sshd_config"), guestSshdConfig(net.guestAddress))
  await Disks.workspace(join(dir, "workspace.img"), limits.diskBytes)
  await Cgroups.make(s.cgroupRoot, spec.id, { ...limits, pids: s.pidsMax })
  const log = openSync(join(dir, "machine.log"), "a")
  const child = spawn("/bin/sh", ["-c", launcher], {
    detached: true,
    stdio: ["ignore", log, log],
    env: {
      PATH: "/usr/sbin:/usr/bin:/sbin:/bin",
      HG_CGROUPS: Cgroups.controllers.map((c) => Cgroups.groupOf(s.cgroupRoot, c, spec.id)).join(" "),
      HG_NETNS: net.netns,
      HG_BASE: spec.base,
      HG_DIR: dir,
      HG_GUEST_CGROUP: Cgroups.guestGroupOf(s.cgroupRoot, spec.id),
    },
  })
  closeSync(log)
  child.unref()
  const until = Date.now() + s.readyTimeoutMs
  while (!(await tcpOpen(net.guestAddress))) {
    if (Date.now() > until) throw new Error(await fs.readFile(join(dir, "machine.log"), "utf8"))
    await new Promise((r) => setTimeout(r, 3))
  }
  return {
    id: spec.id,
    size: spec.size,
    limits,
    ssh: {
      host: net.guestAddress,
      port: 22,
      hostKey: `${hostKey.type} ${hostKey.getPublicSSH().toString("base64")}`,
    },
    handle: { dir },
  }
}

/** The old driver, for baselines only. */
export const bwrapBaseline: MachineDriverService = {
  kind: "namespace",
  create: (spec) =>
    Effect.tryPromise({
      try: async () => {
        try {
          return await createNow(spec)
        } catch (e) {
          await destroyNow(spec.id).catch(() => undefined)
          throw e
        }
      },
      catch: (e) => new MachineCreateFailed({ id: spec.id, step: "baseline", detail: String(e) }),
    }),
  // The bench makes no machine in the background.
  wanted: () => Effect.void,
  destroy: (id) =>
    Effect.tryPromise({
      try: () => destroyNow(id),
      catch: (e) => new MachineDestroyFailed({ id, detail: String(e) }),
    }),
  // The baseline only makes and removes machines; no later life takes one over.
  owned: () => Effect.succeed([]),
  claim: () => Effect.void,
  keep: () => Effect.void,
  adopt: () => Effect.succeedNone,
}
