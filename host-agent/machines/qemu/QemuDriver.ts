/**
 * The `qemu` machine driver: a machine is a QEMU microVM booting Debian's cloud kernel with a tiny
 * init (no systemd). Its root disk is a qcow2 overlay over a read-only ext4 image of the base, its
 * `/workspace` a sparse ext4 disk of the size's capacity, its keys ride in an archive appended to
 * the initramfs. KVM is used where the kernel boots on it, TCG otherwise (see `Accel.ts`).
 *
 * The network (`network` setting):
 * - `tap` (the default, production): a tap device on the host named like the namespace driver's
 *   veth, on a /30 leased from the same pool (`../namespace/Net.ts`), policed by the same nftables
 *   rules (`../../network/Policy.ts`); the guest gets its address and gateway on the kernel command
 *   line and sshd listens on it, so the host agent reaches it as it reaches a namespace machine.
 * - `user`: QEMU's user network with `restrict=on` (no way out) and only the SSH port forwarded to
 *   a loopback port of the host, for hosts where a test may not add devices.
 *
 * A machine made in the background (`MachineSpec.background`) runs QEMU at `backgroundNice` until
 * `wanted` sets all its threads back to the host agent's nice.
 *
 * Everything a machine owns is its folder, its one process and, with `tap`, its device, slot and
 * policy chain. Not done yet: running QEMU as an unprivileged user in a sandbox.
 */
import { spawn } from "node:child_process"
import { closeSync, openSync } from "node:fs"
import * as fs from "node:fs/promises"
import { connect, createServer } from "node:net"
import { join } from "node:path"
import { Config, Effect, Layer, Option } from "effect"
import ssh2 from "ssh2"
import { defineSettings, env } from "../../../core/Config.ts"
import * as Policy from "../../network/Policy.ts"
import { normalNice, reniceAll } from "../HostFiles.ts"
import {
  adoptIn,
  alive,
  backgroundNice,
  claimIn,
  keepIn,
  limitsOf,
  MACHINE_ID,
  type Machine,
  MachineCreateFailed,
  MachineDestroyFailed,
  MachineDriver,
  type MachineDriverService,
  type MachineSpec,
  machineFolder,
  ownedIn,
  type Size,
} from "../MachineDriver.ts"
import { run } from "../namespace/exec.ts"
import * as Net from "../namespace/Net.ts"
import * as Accel from "./Accel.ts"
import * as Disks from "./Disks.ts"
import { configArchive, type GuestNet, netArgs, userNet } from "./Init.ts"
import * as Kernel from "./Kernel.ts"

const GiB = 1024 ** 3

/** Where the driver keeps machines and caches, and how it runs QEMU. */
export const QemuDriverSettings = defineSettings(
  "host-agent/QemuDriver",
  {
    machinesDir: "/var/lib/hangar/vms",
    /** Kernels, initramfs and base images, shared by every checkout on the host. */
    cacheDir: "/var/cache/hangar/qemu",
    qemu: "qemu-system-x86_64",
    /** A static busybox (Debian's `busybox-static`), the initramfs's only program. */
    busybox: "/bin/busybox",
    /** The Debian kernel package (a metapackage is followed to its versioned kernel). */
    kernelPackage: "linux-image-cloud-amd64",
    /** `auto` probes KVM once per driver and falls back to TCG. */
    accel: "auto" as "auto" | Accel.Accel,
    kvmDevice: "/dev/kvm",
    probeTimeoutMs: 10_000,
    /** Free space of the root filesystem beyond the base (the image is sparse). */
    rootHeadroomBytes: 4 * GiB,
    termGraceMs: 2000,
    readyTimeoutMs: 60_000,
    network: "tap" as "tap" | "user",
    /** As the namespace driver's: leases and the /16 pool machine addresses come from. */
    runDir: "/run/hangar",
    addressPool: "10.213.0.0",
  },
  (d) => ({
    machinesDir: env.string("QEMU_MACHINES_DIR", d.machinesDir),
    cacheDir: env.string("QEMU_CACHE_DIR", d.cacheDir),
    qemu: env.string("QEMU_BINARY", d.qemu),
    kernelPackage: env.string("QEMU_KERNEL_PACKAGE", d.kernelPackage),
    accel: Config.literal("auto", "kvm", "tcg")("HANGAR_QEMU_ACCEL").pipe(Config.withDefault(d.accel)),
    termGraceMs: env.integer("MACHINE_TERM_GRACE_MS", d.termGraceMs),
    readyTimeoutMs: env.integer("QEMU_READY_TIMEOUT_MS", d.readyTimeoutMs),
    network: Config.literal("tap", "user")("HANGAR_QEMU_NETWORK").pipe(Config.withDefault(d.network)),
    runDir: env.string("RUN_DIR", d.runDir),
    addressPool: env.string("MACHINE_ADDRESS_POOL", d.addressPool),
  }),
)
type Settings = typeof QemuDriverSettings.defaults

const MiB = 1024 ** 2

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** The qemu pid recorded in machine folder `dir`, if that process still runs QEMU for it. */
const qemuOf = async (dir: string): Promise<number | undefined> => {
  const pid = Number(await fs.readFile(join(dir, "qemu.pid"), "utf8").catch(() => ""))
  if (!Number.isInteger(pid) || pid <= 0) return undefined
  // A recycled pid belongs to someone else: only a process naming this folder is ours.
  const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")
  return cmdline.includes(dir) && (await alive(pid)) ? pid : undefined
}

const freePort = () =>
  new Promise<number>((ok, fail) => {
    const server = createServer()
    server.once("error", fail)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() =>
        typeof address === "object" && address ? ok(address.port) : fail(new Error("no port")),
      )
    })
  })

// With the user network the port is forwarded by QEMU itself, which accepts before the guest
// listens; only sshd's banner says the machine is up.
const sshBanner = (host: string, port: number) =>
  new Promise<boolean>((ok) => {
    const socket = connect({ host, port })
    const finish = (up: boolean) => {
      clearTimeout(timer)
      socket.destroy()
      ok(up)
    }
    const timer = setTimeout(() => finish(false), 2000)
    socket.once("data", (b: Buffer) => finish(b.toString("latin1").startsWith("SSH-")))
    socket.once("error", () => finish(false))
    socket.once("close", () => finish(false))
  })

const tail = async (path: string) => (await fs.readFile(path, "utf8").catch(() => "")).slice(-1500)

const argsOf = (
  dir: string,
  kernel: Kernel.Kernel,
  accel: Accel.Accel,
  khz: number,
  limits: Size,
  network: { readonly guest: GuestNet; readonly netdev: string },
): Array<string> => {
  const append = [
    "console=ttyS0",
    "panic=-1",
    "quiet",
    ...(accel === "tcg" ? [`tsc_early_khz=${khz}`] : []),
    ...netArgs(network.guest),
  ]
  return [
    ...["-M", Accel.MACHINE, "-accel", accel, "-cpu", accel === "kvm" ? "host" : "max"],
    ...["-m", String(Math.max(128, Math.floor(limits.memoryBytes / MiB))), "-smp", String(limits.vcpus)],
    ...["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"],
    ...["-kernel", kernel.vmlinuz, "-initrd", join(dir, "initrd.cpio"), "-append", append.join(" ")],
    ...["-drive", `id=root,file=${join(dir, "root.qcow2")},format=qcow2,if=none`],
    ...["-device", "virtio-blk-device,drive=root,serial=root"],
    ...["-drive", `id=workspace,file=${join(dir, "workspace.img")},format=raw,if=none`],
    ...["-device", "virtio-blk-device,drive=workspace,serial=workspace"],
    ...["-netdev", `${network.netdev},id=net0`],
    ...["-device", "virtio-net-device,netdev=net0"],
    ...["-serial", `file:${join(dir, "console.log")}`],
  ]
}

/** Makes machine `id`'s tap device on its leased /30, up, and puts it under the policy. */
const tapUp = async (policy: Policy.PolicySettingsValue, n: Net.NetLease): Promise<void> => {
  await run("ip", ["-batch", "-"], {
    input: [
      `tuntap add dev ${n.hostIf} mode tap`,
      `addr add ${n.hostAddress}/30 dev ${n.hostIf}`,
      `link set ${n.hostIf} up`,
    ].join("\n"),
  })
  await Policy.attach(policy, { iface: n.hostIf, guestAddress: n.guestAddress })
}

/**
 * Removes what `tapUp` and the lease made; missing parts are fine, and an id holding no slot has
 * none (`Net.leased`). The slot goes back last, once the rest is gone.
 */
const tapDown = async (s: Settings, policy: Policy.PolicySettingsValue, id: string): Promise<void> => {
  if (!Net.leased(s.runDir, id)) return
  await Policy.detach(policy, Net.hostIfOf(id))
  await Net.down(id)
  await Net.release(s.runDir, id)
}

const destroyNow = async (s: Settings, policy: Policy.PolicySettingsValue, id: string): Promise<void> => {
  if (!MACHINE_ID.test(id)) throw new Error(`machine id must match ${MACHINE_ID}`)
  const dir = join(s.machinesDir, id)
  const pid = await qemuOf(dir)
  if (pid !== undefined) {
    // QEMU exits at once on SIGTERM; SIGKILL is for one that is stuck.
    process.kill(pid, "SIGTERM")
    const term = Date.now() + s.termGraceMs
    while ((await alive(pid)) && Date.now() < term) await sleep(10)
    if (await alive(pid)) process.kill(pid, "SIGKILL")
    const kill = Date.now() + 5_000
    while (await alive(pid)) {
      if (Date.now() > kill) throw new Error(`qemu ${pid} survived SIGKILL`)
      await sleep(10)
    }
  }
  // The tap outlives QEMU (it was made persistent before QEMU opened it).
  if (s.network === "tap") await tapDown(s, policy, id)
  await fs.rm(dir, { recursive: true, force: true })
}

interface Shared {
  readonly kernel: () => Promise<Kernel.Kernel>
  readonly accel: (kernel: Kernel.Kernel) => Promise<Accel.Probe>
}

// Made once per driver: the kernel (fetched on first use) and the accelerator (probed once). A
// failure is not kept, so the next machine tries again.
const shared = (s: Settings): Shared => {
  let kernel: Promise<Kernel.Kernel> | undefined
  let accel: Promise<Accel.Probe> | undefined
  const once = <A>(
    get: () => Promise<A> | undefined,
    set: (p: Promise<A> | undefined) => void,
    f: () => Promise<A>,
  ) => {
    const p =
      get() ??
      f().catch((e) => {
        set(undefined)
        throw e
      })
    set(p)
    return p
  }
  return {
    kernel: () =>
      once(
        () => kernel,
        (p) => {
          kernel = p
        },
        () => Kernel.ensure(s.cacheDir, s.kernelPackage, s.busybox),
      ),
    accel: (k) =>
      s.accel !== "auto"
        ? Promise.resolve({ accel: s.accel, detail: "chosen by configuration" })
        : once(
            () => accel,
            (p) => {
              accel = p
            },
            () => Accel.probe(s.qemu, k, s.kvmDevice, s.probeTimeoutMs),
          ),
  }
}

const createNow = async (
  s: Settings,
  policy: Policy.PolicySettingsValue,
  cache: Shared,
  spec: MachineSpec,
  /** The machines made in the background and not wanted yet. */
  behind: ReadonlySet<string>,
): Promise<Machine> => {
  const limits = limitsOf(spec)
  const dir = join(s.machinesDir, spec.id)
  let step = "folder"
  try {
    await machineFolder(s.machinesDir, spec.id, spec.owner) // fails if the id is in use

    step = "ssh"
    const hostKey = ssh2.utils.parseKey(spec.hostKey)
    if (hostKey instanceof Error) throw hostKey
    const hostPublic = `${hostKey.type} ${hostKey.getPublicSSH().toString("base64")}`

    step = "network"
    const tap = s.network === "tap" ? await Net.lease(s.runDir, s.addressPool, spec.id) : undefined
    if (tap !== undefined) {
      step = "policy"
      await tapUp(policy, tap)
    }
    const guest: GuestNet =
      tap === undefined ? userNet : { address: tap.guestAddress, prefix: 30, gateway: tap.hostAddress }

    step = "kernel"
    const kernel = await cache.kernel()
    const accel = await cache.accel(kernel)
    const khz = await Accel.hostKhz()
    await fs.writeFile(
      join(dir, "initrd.cpio"),
      Buffer.concat([
        await fs.readFile(kernel.initrd),
        configArchive(spec.hostKey, spec.authorizedKey, guest.address),
      ]),
      { mode: 0o600 },
    )

    step = "disks"
    const base = await Disks.baseImage(s.cacheDir, spec.base, s.rootHeadroomBytes)
    await Disks.overlay(join(dir, "root.qcow2"), base)
    await Disks.workspace(join(dir, "workspace.img"), limits.diskBytes)

    // The loopback port (user network) is picked free just before QEMU binds it; losing that race
    // is retried.
    for (let attempt = 1; ; attempt++) {
      step = "start"
      const ssh =
        tap === undefined
          ? { host: "127.0.0.1", port: await freePort() }
          : { host: tap.guestAddress, port: 22 }
      const netdev =
        tap === undefined
          ? `user,restrict=on,hostfwd=tcp:127.0.0.1:${ssh.port}-:22`
          : `tap,ifname=${tap.hostIf},script=no,downscript=no`
      const log = openSync(join(dir, "qemu.log"), "w")
      const child = spawn(s.qemu, argsOf(dir, kernel, accel.accel, khz, limits, { guest, netdev }), {
        detached: true,
        stdio: ["ignore", log, log],
      })
      closeSync(log)
      const spawned = await new Promise<number>((ok, fail) => {
        child.once("spawn", () => ok(child.pid ?? 0))
        child.once("error", fail)
      })
      child.unref()
      // In the background: its threads so far, and so those they start. (Not `nice qemu…`: its
      // nice would come after the spawn is seen, and could undo a `wanted` of the moment between.)
      const niced = behind.has(spec.id)
      if (niced) reniceAll(spawned, backgroundNice())
      await fs.writeFile(join(dir, "qemu.pid"), `${spawned}\n`)
      // Wanted since (`wanted` found no pid to set).
      if (niced && !behind.has(spec.id)) reniceAll(spawned, normalNice())

      step = "ready"
      const until = Date.now() + s.readyTimeoutMs
      let up = await sshBanner(ssh.host, ssh.port)
      while (!up && (await alive(spawned)) && Date.now() < until) {
        await sleep(50)
        up = await sshBanner(ssh.host, ssh.port)
      }
      if (up) {
        return {
          id: spec.id,
          size: spec.size,
          limits,
          ssh: { ...ssh, hostKey: hostPublic },
          handle: {
            pid: spawned,
            dir,
            port: ssh.port,
            network: s.network,
            ...(tap === undefined
              ? {}
              : { iface: tap.hostIf, address: tap.guestAddress, hostAddress: tap.hostAddress }),
            accel: accel.accel,
            accelDetail: accel.detail,
            kernel: kernel.package,
          },
        }
      }
      const qemuLog = await tail(join(dir, "qemu.log"))
      if (!(await alive(spawned)) && qemuLog.includes("host forwarding") && attempt < 3) continue
      throw new Error(
        `sshd did not answer (${accel.accel}): qemu: ${qemuLog}\nconsole: ${await tail(join(dir, "console.log"))}`,
      )
    }
  } catch (e) {
    const detail = e instanceof Error ? e.message : String(e)
    if (step !== "folder" || !detail.includes("EEXIST"))
      await destroyNow(s, policy, spec.id).catch(() => undefined)
    throw new MachineCreateFailed({ id: spec.id, step, detail })
  }
}

/** The driver with the given settings; tap networks follow `policy` (the defaults unless given). */
export const make = (
  s: Settings,
  policy: Policy.PolicySettingsValue = Policy.PolicySettings.defaults,
): MachineDriverService => {
  const cache = shared(s)
  const behind = new Set<string>()
  return {
    kind: "qemu",
    create: (spec) =>
      Effect.tryPromise({
        try: () => {
          if (spec.background === true) behind.add(spec.id)
          return createNow(s, policy, cache, spec, behind).catch((e) => {
            behind.delete(spec.id)
            throw e
          })
        },
        catch: (e) =>
          e instanceof MachineCreateFailed
            ? e
            : new MachineCreateFailed({ id: spec.id, step: "?", detail: String(e) }),
      }).pipe(
        Effect.tap((m) =>
          Effect.logDebug("machine created").pipe(
            Effect.annotateLogs({ machine: m.id, accel: String(m.handle.accel), port: m.ssh.port }),
          ),
        ),
        Effect.withSpan("QemuDriver.create"),
      ),
    wanted: (id) =>
      Effect.promise(async () => {
        if (!behind.delete(id)) return
        // Not yet started: it is started at the host agent's nice (`createNow` looks again once it
        // has its pid).
        const pid = await qemuOf(join(s.machinesDir, id))
        if (pid !== undefined) reniceAll(pid, normalNice())
      }),
    destroy: (id) =>
      Effect.tryPromise({
        try: () => {
          behind.delete(id)
          return destroyNow(s, policy, id)
        },
        catch: (e) => new MachineDestroyFailed({ id, detail: e instanceof Error ? e.message : String(e) }),
      }),
    owned: (owner) => ownedIn(s.machinesDir, owner),
    claim: claimIn(s.machinesDir),
    keep: keepIn(s.machinesDir),
    adopt: adoptIn(s.machinesDir),
  }
}

/** The qemu driver as the host's MachineDriver. */
export const layer = Layer.effect(
  MachineDriver,
  Effect.gen(function* () {
    const s = yield* QemuDriverSettings.Tag
    // Optional, so hosts that do not configure the network policy get its defaults.
    const policy = yield* Effect.serviceOption(Policy.PolicySettings.Tag)
    return make(
      s,
      Option.getOrElse(policy, () => Policy.PolicySettings.defaults),
    )
  }),
)
