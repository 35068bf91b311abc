/**
 * The `namespace` machine driver: a machine is an sshd in its own pid/uts/ipc/mount namespaces
 * (bwrap) inside its own network namespace, with cgroup v1 limits. Its root is an overlay whose
 * lower layer is the read-only base and whose upper layer lives in the machine's folder; its
 * `/workspace` is an ext4 image of the size's capacity on a loop device, so a full disk is a real
 * ENOSPC. Both are mounted in a private mount namespace made just before bwrap (Debian 12's bwrap
 * has no `--overlay`), so the host never sees them and they vanish with the machine's processes.
 */
import { spawn } from "node:child_process"
import { closeSync, openSync } from "node:fs"
import * as fs from "node:fs/promises"
import { connect } from "node:net"
import { join } from "node:path"
import { Effect, Layer, Option } from "effect"
import ssh2 from "ssh2"
import { defineSettings, env } from "../../../core/Config.ts"
import * as Policy from "../../network/Policy.ts"
import {
  guestSshdConfig,
  limitsOf,
  type Machine,
  MachineCreateFailed,
  MachineDestroyFailed,
  MachineDriver,
  type MachineDriverService,
  type MachineSpec,
} from "../MachineDriver.ts"
import * as Cgroups from "./Cgroups.ts"
import { run } from "./exec.ts"
import * as Net from "./Net.ts"

/** Where the driver keeps machines and how it limits them. */
export const NamespaceDriverSettings = defineSettings(
  "host-agent/NamespaceDriver",
  {
    machinesDir: "/var/lib/hangar/machines",
    runDir: "/run/hangar",
    cgroupRoot: "/sys/fs/cgroup",
    /** A private /16 (its first two octets are used) cut into one /30 per machine. */
    addressPool: "10.213.0.0",
    pidsMax: 16384,
    termGraceMs: 2000,
    readyTimeoutMs: 15_000,
  },
  (d) => ({
    machinesDir: env.string("MACHINES_DIR", d.machinesDir),
    runDir: env.string("RUN_DIR", d.runDir),
    addressPool: env.string("MACHINE_ADDRESS_POOL", d.addressPool),
    termGraceMs: env.integer("MACHINE_TERM_GRACE_MS", d.termGraceMs),
  }),
)
type Settings = typeof NamespaceDriverSettings.defaults

const ID = /^[a-z0-9_]{1,64}$/

// Runs as the machine's first process: joins the cgroups, enters the netns and a private mount
// namespace, mounts the root overlay and the workspace, then becomes bwrap running sshd. (Commands
// raise their own oom_score_adj so the OOM killer picks them before sshd; lowering sshd's is
// refused on some hosts.)
const launcher = `
set -e
for g in $HG_CGROUPS; do echo $$ > "$g/cgroup.procs" || { echo "cannot join $g"; exit 1; }; done
exec nsenter --net="/run/netns/$HG_NETNS" unshare --mount --propagation private /bin/sh -c '
set -e
# The copies of other machines netns mounts would keep those namespaces alive.
umount -l /run/netns 2>/dev/null || true
mount -t overlay overlay -o "lowerdir=$HG_BASE,upperdir=$HG_DIR/upper,workdir=$HG_DIR/work" "$HG_DIR/root"
mount -o loop "$HG_DIR/workspace.img" "$HG_DIR/root/workspace"
mkdir -p "$HG_DIR/root/run/sshd" "$HG_DIR/root/sys/fs/cgroup/memory"
exec bwrap --bind "$HG_DIR/root" / --dev /dev --proc /proc --bind "$HG_GUEST_CGROUP" /sys/fs/cgroup/memory \\
  --unshare-pid --unshare-uts --unshare-ipc --hostname machine \\
  -- /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
'
`

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const tcpOpen = (host: string, port: number) =>
  new Promise<boolean>((ok) => {
    const socket = connect({ host, port })
    socket.once("connect", () => {
      socket.destroy()
      ok(true)
    })
    socket.once("error", () => ok(false))
  })

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const destroyNow = async (s: Settings, policy: Policy.PolicySettingsValue, id: string): Promise<void> => {
  const dir = join(s.machinesDir, id)
  await Cgroups.killAll(s.cgroupRoot, id, s.termGraceMs)
  // The mounts lived only in the machine's mount namespace, which died with its last process; the
  // loop device is auto-cleared when its filesystem goes, a moment later.
  const image = join(dir, "workspace.img")
  const until = Date.now() + 5_000
  for (;;) {
    const loops = (await run("losetup", ["-n", "-O", "NAME", "-j", image]).catch(() => "")).trim()
    if (!loops) break
    if (Date.now() > until) {
      for (const dev of loops.split("\n")) await run("losetup", ["-d", dev.trim()]).catch(() => undefined)
      break
    }
    await sleep(10)
  }
  await Cgroups.remove(s.cgroupRoot, id)
  await Policy.detach(policy, Net.hostIfOf(id))
  await Net.down(id)
  await Net.release(s.runDir, id)
  for (const m of ["root/workspace", "root"]) await run("umount", ["-l", join(dir, m)]).catch(() => undefined)
  await fs.rm(dir, { recursive: true, force: true })
}

const createNow = async (
  s: Settings,
  policy: Policy.PolicySettingsValue,
  spec: MachineSpec,
): Promise<Machine> => {
  const limits = limitsOf(spec)
  const dir = join(s.machinesDir, spec.id)
  let step = "folder"
  try {
    if (!ID.test(spec.id)) throw new Error(`machine id must match ${ID}`)
    await fs.mkdir(s.machinesDir, { recursive: true })
    await fs.mkdir(dir) // fails if the id is in use
    for (const d of ["upper/etc/ssh", "work", "root"]) await fs.mkdir(join(dir, d), { recursive: true })

    step = "network"
    const net = await Net.lease(s.runDir, s.addressPool, spec.id)
    await Net.up(net)
    step = "policy"
    await Policy.attach(policy, { iface: net.hostIf, guestAddress: net.guestAddress })

    step = "ssh"
    const hostKey = ssh2.utils.parseKey(spec.hostKey)
    if (hostKey instanceof Error) throw hostKey
    const hostPublic = `${hostKey.type} ${hostKey.getPublicSSH().toString("base64")}`
    await fs.writeFile(join(dir, "upper/etc/ssh/hangar_host_key"), spec.hostKey, { mode: 0o600 })
    await fs.writeFile(join(dir, "upper/etc/ssh/hangar_authorized_keys"), `${spec.authorizedKey.trim()}\n`)
    await fs.writeFile(join(dir, "upper/etc/ssh/sshd_config"), guestSshdConfig(net.guestAddress))

    step = "workspace"
    const image = join(dir, "workspace.img")
    const fd = openSync(image, "w")
    closeSync(fd)
    await fs.truncate(image, limits.diskBytes)
    await run("mkfs.ext4", [
      "-q",
      "-F",
      "-m",
      "0",
      "-E",
      "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
      image,
    ])

    step = "cgroups"
    await Cgroups.make(s.cgroupRoot, spec.id, { ...limits, pids: s.pidsMax })

    step = "start"
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
    const pid = child.pid ?? 0

    step = "ready"
    const until = Date.now() + s.readyTimeoutMs
    while (!(await tcpOpen(net.guestAddress, 22))) {
      if (!alive(pid) || Date.now() > until) {
        const tail = await fs.readFile(join(dir, "machine.log"), "utf8").catch(() => "")
        throw new Error(`sshd did not start: ${tail.slice(-2000)}`)
      }
      await sleep(3)
    }
    return {
      id: spec.id,
      size: spec.size,
      limits,
      ssh: { host: net.guestAddress, port: 22, hostKey: hostPublic },
      handle: { pid, dir, netns: net.netns, hostIf: net.hostIf, hostAddress: net.hostAddress },
    }
  } catch (e) {
    const detail = e instanceof Error ? e.message : String(e)
    if (step !== "folder" || !detail.includes("EEXIST"))
      await destroyNow(s, policy, spec.id).catch(() => undefined)
    throw new MachineCreateFailed({ id: spec.id, step, detail })
  }
}

/** The driver with the given settings; machine networks follow `policy` (the defaults unless given). */
export const make = (
  s: Settings,
  policy: Policy.PolicySettingsValue = Policy.PolicySettings.defaults,
): MachineDriverService => ({
  kind: "namespace",
  create: (spec) =>
    Effect.tryPromise({
      try: () => createNow(s, policy, spec),
      catch: (e) =>
        e instanceof MachineCreateFailed
          ? e
          : new MachineCreateFailed({ id: spec.id, step: "?", detail: String(e) }),
    }).pipe(Effect.withSpan("NamespaceDriver.create")),
  destroy: (id) =>
    Effect.tryPromise({
      try: () => destroyNow(s, policy, id),
      catch: (e) => new MachineDestroyFailed({ id, detail: e instanceof Error ? e.message : String(e) }),
    }),
})

/** The namespace driver as the host's MachineDriver. */
export const layer = Layer.effect(
  MachineDriver,
  Effect.gen(function* () {
    const s = yield* NamespaceDriverSettings.Tag
    // Optional, so hosts that do not configure the network policy get its defaults.
    const policy = yield* Effect.serviceOption(Policy.PolicySettings.Tag)
    return make(
      s,
      Option.getOrElse(policy, () => Policy.PolicySettings.defaults),
    )
  }),
)
