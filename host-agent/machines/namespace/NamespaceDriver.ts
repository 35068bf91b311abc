/**
 * The `namespace` machine driver: a machine is an sshd run by `crun` (an OCI runtime, Debian's
 * package) as an unprivileged tenant of the host: its root is a uid range of its own on the host
 * (user namespace), with its own pid, ipc, uts, mount and cgroup namespaces, a reduced capability
 * set, a seccomp allow-list and masked `/proc` paths (`Oci.ts` says which and why), inside the
 * network namespace the driver made for it (`Net.ts`, policed by `network/Policy.ts`), and under
 * cgroup v1 limits for memory, CPU, processes and disk I/O (`Cgroups.ts`).
 *
 * Its disk is one ext4 image of the size's capacity on a loop device: it holds `/workspace` and the
 * writable layer of the root (an overlay whose lower layer is the read-only base, shown to the
 * machine through an idmapped mount so that its root owns it), so every byte the machine writes
 * anywhere counts against its size, and a full disk is a real ENOSPC. The image is a sparse copy of
 * the empty one of its size (`Disks.workspaceTemplate`, in the run folder), its first files moved
 * onto it as it is mounted, owned by the machine's range. The disk and the overlay
 * are mounted in a private mount namespace made just before crun, so the host never sees them and
 * they vanish with the machine's processes.
 *
 * Making and removing a machine run on a thread of their own (one per process, started with the
 * host agent's driver, else at the first machine): about 35 ms of synchronous work a machine
 * (small files, cgroups, the tool runner's frames) that would otherwise hold the thread every
 * run's commands and actors share.
 *
 * A machine made in the background (a warm one, `MachineSpec.background`) yields the CPU to
 * running work until a run wants it: while every job of the machine thread is such a making, the
 * thread and the tools it starts (mkfs, crun, ip, nft…) run at `backgroundNice`, and the
 * machine's processes (its sshd starting, the pool's session to it) are in a group of weight
 * `BACKGROUND_WEIGHT`. `wanted` gives both back; a removal, or a run's own machine, brings the
 * thread back to the host agent's nice (`normalNice`, 0 unless its operator chose another) while
 * it lasts (a run may wait for either). The machine's own first process is set back to that once
 * crun made it, so nothing in a machine runs niced: its group's weight is what holds it back, and
 * it is the host's to change.
 */
import {
  chmodSync,
  lchownSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  statfsSync,
  statSync,
  writeFileSync,
} from "node:fs"
import * as fs from "node:fs/promises"
import { availableParallelism, endianness, setPriority } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { isMainThread, parentPort, SHARE_ENV, Worker, workerData } from "node:worker_threads"
import { Effect, Layer, Option } from "effect"
import ssh2 from "ssh2"
import { defineSettings, env } from "../../../core/Config.ts"
import * as Policy from "../../network/Policy.ts"
import { niceIn, normalNice, readText } from "../HostFiles.ts"
import {
  adoptIn,
  alive,
  BACKGROUND_WEIGHT,
  backgroundNice,
  claimIn,
  guestSshdConfig,
  keepIn,
  limitsOf,
  type Machine,
  MachineCreateFailed,
  MachineDestroyFailed,
  MachineDriver,
  type MachineDriverService,
  type MachineSpec,
  machineFolder,
  NORMAL_WEIGHT,
  ownedIn,
} from "../MachineDriver.ts"
import * as Disks from "../qemu/Disks.ts"
import * as Cgroups from "./Cgroups.ts"
import { launch, run, setToolNice, toolRunnerPid } from "./exec.ts"
import * as Lxcfs from "./Lxcfs.ts"
import * as Net from "./Net.ts"
import * as Oci from "./Oci.ts"

/** Where the driver keeps machines and how it limits them. */
export const NamespaceDriverSettings = defineSettings(
  "host-agent/NamespaceDriver",
  {
    machinesDir: "/var/lib/hangar/machines",
    runDir: "/run/hangar",
    cgroupRoot: "/sys/fs/cgroup",
    /** A private /16 (its first two octets are used) cut into one /30 per machine. */
    addressPool: "10.213.0.0",
    /**
     * The host id of root in the machine on network slot 0; slot n's machine has the 65536 ids
     * from idBase + n × 65536 (slots are unique on the host, so ranges never overlap).
     */
    idBase: 1_000_000,
    /** The OCI runtime and the seccomp profile it is given (see `Oci.ts`). */
    crun: "crun",
    seccompProfile: "/usr/share/containers/seccomp.json",
    /** Disk bandwidth and operations per second per vCPU (the spec: 50 MB/s and 5,000). */
    diskBytesPerSecondPerVcpu: 50_000_000,
    diskOpsPerSecondPerVcpu: 5_000,
    /**
     * How many times over the host's free space machine disks may be promised: 1 counts every
     * sparse image at its full size. Tests, which run many 16 GiB machines on small CI disks, use
     * 16 (`HANGAR_MACHINE_DISK_OVERCOMMIT`); only the admission test counts in full.
     */
    diskOvercommit: 1,
    /** Network bandwidth per vCPU, each way (the spec: 25 MB/s). */
    networkBytesPerSecondPerVcpu: 25_000_000,
    /** The most machines a host holds at once (its vCPU budget of 1-vCPU machines); sizes pids.max. */
    maxMachines: 14,
    /** Processes (tasks) per machine at most; lowered at start so all machines together stay under half the host's limit. */
    pidsMax: 16384,
    termGraceMs: 2000,
    readyTimeoutMs: 15_000,
  },
  (d) => ({
    machinesDir: env.string("MACHINES_DIR", d.machinesDir),
    runDir: env.string("RUN_DIR", d.runDir),
    addressPool: env.string("MACHINE_ADDRESS_POOL", d.addressPool),
    seccompProfile: env.string("MACHINE_SECCOMP_PROFILE", d.seccompProfile),
    diskOvercommit: env.integer("MACHINE_DISK_OVERCOMMIT", d.diskOvercommit),
    termGraceMs: env.integer("MACHINE_TERM_GRACE_MS", d.termGraceMs),
  }),
)
type Settings = typeof NamespaceDriverSettings.defaults

// Makes and starts the machine's container: in a mount namespace of its own, all of whose mounts it
// makes private first, `machine-root.pl` mounts its disk, the idmapped base and the root overlay,
// then becomes crun's `run --detach` (see there). The container keeps the mounts alive; the
// namespace ends with it.
const machineRoot = fileURLToPath(new URL("./machine-root.pl", import.meta.url))

/** The host id of root in the machine on network slot `slot`. */
export const hostIdOf = (s: Settings, slot: number) => s.idBase + slot * Oci.ID_COUNT

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

/**
 * Whether process `pid` holds a socket past its stdio: what sshd opens just before it listens, and
 * ~40 µs to look at, where a read of its `/proc` TCP table takes ~1 ms (the kernel walks the host's
 * whole connection table for it).
 */
const holdsSocket = (pid: number): boolean => {
  let fds: Array<string>
  try {
    fds = readdirSync(`/proc/${pid}/fd`)
  } catch {
    return false // it ended
  }
  return fds.some((fd) => {
    if (Number(fd) <= 2) return false
    try {
      return readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith("socket:")
    } catch {
      return false // closed meanwhile
    }
  })
}

/**
 * Whether a TCP socket of process `pid`'s network namespace listens on IPv4 `address`:`port`, as
 * its `/proc` table shows (read only once the process holds a socket): no connection is made. A
 * probe connection cost the machine's sshd a fork (and the connection's end) just as the host
 * agent's own connection came.
 */
export const listening = (pid: number, address: string, port: number): boolean => {
  if (!holdsSocket(pid)) return false
  const table = readText(`/proc/${pid}/net/tcp`)
  if (table === undefined) return false
  // The address as the kernel prints it: its 32 bits read in this machine's byte order.
  const octets = Buffer.from(address.split(".").map(Number))
  const word = endianness() === "LE" ? octets.readUInt32LE(0) : octets.readUInt32BE(0)
  const local = `${word.toString(16).padStart(8, "0")}:${port.toString(16).padStart(4, "0")}`.toUpperCase()
  // Lines: `sl local_address rem_address st ...`, state 0A is LISTEN.
  return table.split("\n").some((line) => {
    const [, at, , state] = line.trim().split(/\s+/)
    return state === "0A" && (at === local || at === `00000000:${local.slice(9)}`)
  })
}

const crunRoot = (s: Settings) => join(s.runDir, "crun")

/** The kernel's process id ceiling this driver raises a host to (the 64-bit kernel's maximum). */
export const HOST_PID_MAX = 4_194_304

const readNumber = (path: string) => Number(readFileSync(path, "utf8").trim())

/**
 * Readies the host once per process: raises `kernel.pid_max` to its maximum, and answers the
 * machines' `pids.max` so that all machines of a full host (`maxMachines`) together hold at most
 * half of the host's process ids and threads; the host keeps the other half.
 */
const hostLimits = (s: Settings): { readonly pidsMax: number } => {
  const known = hostLimitsOf.get(s.maxMachines)
  if (known !== undefined) return { pidsMax: Math.min(s.pidsMax, known) }
  let pidMax = readNumber("/proc/sys/kernel/pid_max")
  if (pidMax < HOST_PID_MAX) {
    try {
      writeFileSync("/proc/sys/kernel/pid_max", String(HOST_PID_MAX))
      pidMax = HOST_PID_MAX
    } catch {
      // A host that does not let us: the share below is of what it has.
    }
  }
  const threadsMax = readNumber("/proc/sys/kernel/threads-max")
  const share = Math.max(64, Math.floor(Math.min(pidMax, threadsMax) / 2 / s.maxMachines))
  hostLimitsOf.set(s.maxMachines, share)
  return { pidsMax: Math.min(s.pidsMax, share) }
}
const hostLimitsOf = new Map<number, number>()

/** The cores of a cpuset list (`0-2,5`). */
const coresOf = (list: string): Array<number> =>
  list
    .trim()
    .split(",")
    .filter((p) => p !== "")
    .flatMap((part) => {
      const [a, b] = part.split("-").map(Number)
      return b === undefined
        ? [a as number]
        : Array.from({ length: b - (a as number) + 1 }, (_, i) => (a as number) + i)
    })

/**
 * The host CPUs a machine of `vcpus` runs on: fewer vCPUs than the host has cores are pinned to
 * the cores the fewest machines are pinned to now (`nproc` shows the size, and two small machines
 * share a core only when every core is taken); otherwise all. `pinned` lists the other machines'
 * cpusets.
 */
export const cpusOf = (
  vcpus: number,
  pinned: ReadonlyArray<string>,
  cores: number = availableParallelism(),
): string | undefined => {
  if (vcpus >= cores) return undefined
  const load = Array.from({ length: cores }, () => 0)
  for (const list of pinned) for (const c of coresOf(list)) if (c < cores) load[c] = (load[c] ?? 0) + 1
  const picked = load
    .map((n, core) => ({ n, core }))
    .sort((x, y) => x.n - y.n || x.core - y.core)
    .slice(0, vcpus)
    .map((x) => x.core)
    .sort((a, b) => a - b)
  return picked.join(",")
}

/** The cpusets of the machines on the host now (cgroupfs files: read synchronously, as `Cgroups`). */
const pinnedNow = (s: Settings): Array<string> => {
  const root = join(s.cgroupRoot, "cpuset", "hangar")
  const out: Array<string> = []
  let ids: Array<string> = []
  try {
    // The machines' groups: the folder's files are the group's own settings.
    ids = readdirSync(root, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
  } catch {
    return out
  }
  for (const id of ids) {
    const list = readText(join(root, id, "cpuset.cpus")) // undefined: the machine is gone
    if (list !== undefined && list.trim() !== "") out.push(list)
  }
  return out
}

/**
 * The loop devices backing machine folder `dir`'s disk image, from the kernel's list in sysfs
 * (`/sys/block/loopN/loop/backing_file`, the file's path from the host's root; `losetup -j` asks
 * the same, at a tool run each). None when the image is gone: nothing can be found by it then.
 */
export const loopsOf = (dir: string): Array<string> => {
  let image: string
  try {
    image = realpathSync(join(dir, "disk.img"))
  } catch {
    return []
  }
  const found: Array<string> = []
  for (const name of readdirSync("/sys/block")) {
    if (!name.startsWith("loop")) continue
    const file = join("/sys/block", name, "loop", "backing_file")
    // Only an attached device has it (looked at without a thrown error: a host has dozens unattached).
    if (statSync(file, { throwIfNoEntry: false }) === undefined) continue
    // Undefined: detached meanwhile.
    if (readText(file)?.trimEnd() === image) found.push(join("/dev", name))
  }
  return found
}

const destroyNow = async (s: Settings, policy: Policy.PolicySettingsValue, id: string): Promise<void> => {
  const dir = join(s.machinesDir, id)
  // Processes first, with the disk throttles lifted so none is stuck in throttled I/O. Until they
  // are gone nothing else is released (above all not the network slot, whose uid range they hold):
  // a failure here leaves the machine whole for the next destroy.
  await Cgroups.unthrottle(s.cgroupRoot, id)
  await Cgroups.killAll(s.cgroupRoot, id, s.termGraceMs)
  // The rest is done step by step, each tried whatever the others did; what failed is reported.
  const failed: Array<string> = []
  const step = async (what: string, f: () => Promise<unknown>) => {
    try {
      await f()
      return true
    } catch (e) {
      failed.push(`${what}: ${messageOf(e)}`)
      return false
    }
  }
  // crun's own record of the container: with no process left, `crun delete` only removes this
  // folder and the groups (removed below), so it is removed here, without the tool run.
  await step("crun state", async () => rmSync(join(crunRoot(s), id), { recursive: true, force: true }))
  // The mounts lived only in the machine's mount namespaces, which died with its last process;
  // detaching a loop device still in use by a dying mount defers the detach to its release.
  // A device still in use is detached by the kernel at its release, which comes within a few
  // milliseconds: each is asked once, then looked at after 1, 2, 4 and 8 ms and every 10 ms after,
  // asked again at each of those (a kernel may refuse a busy device instead of deferring).
  await step("loop device", async () => {
    const until = Date.now() + 5_000
    const asked = new Set<string>()
    for (let pause = 1; ; pause = Math.min(10, pause * 2)) {
      const loops = loopsOf(dir)
      if (loops.length === 0) return
      for (const dev of loops) {
        if (asked.has(dev) && pause < 10) continue
        asked.add(dev)
        await run("losetup", ["-d", dev]).catch(() => undefined)
      }
      if (Date.now() > until) throw new Error(`still attached: ${loops.join(" ")}`)
      await sleep(pause)
    }
  })
  await step("cgroups", () => Cgroups.remove(s.cgroupRoot, id))
  // Only an id holding a network slot has a network (`Net.leased`); one without runs no tool here
  // (a warm run's claim, removed as the run ends: its `nft` and `ip` took 40–60 ms). The slot goes
  // back once the rules are gone (`Net.down` goes on past a missing part and never fails): after a
  // destroy that failed there the id still holds it, and a destroy asked again detaches them.
  if (Net.leased(s.runDir, id)) {
    const detached = await step("network policy", () => Policy.detach(policy, Net.hostIfOf(id)))
    await step("network", () => Net.down(id))
    if (detached) await step("network slot", () => Net.release(s.runDir, id))
  }
  await step("folder", () => fs.rm(dir, { recursive: true, force: true }))
  if (failed.length > 0) throw new Error(failed.join("; "))
}

/**
 * Bytes machine folder `dir` may still take from the host's disk: what its sparse image may still
 * grow by, or, before the image is made, the disk it reserved (`reserved`, written before its
 * admission is checked, so two machines admitted at once each count the other).
 */
const unallocated = (dir: string) => {
  try {
    const st = statSync(join(dir, "disk.img"), { throwIfNoEntry: false })
    if (st !== undefined && st.size > 0) return Math.max(0, st.size - st.blocks * 512)
    return Number(readFileSync(join(dir, "reserved"), "utf8")) || 0
  } catch {
    return 0 // not a machine's folder (a stray file: ENOTDIR), or one being removed
  }
}

/**
 * Admits a machine only when the host's disk can hold it and every other machine at full size:
 * free space must cover this disk and what the others' sparse images may still grow by.
 */
const checkDiskRoom = (s: Settings, id: string, diskBytes: number) => {
  let promised = diskBytes
  for (const other of readdirSync(s.machinesDir)) {
    if (other !== id) promised += unallocated(join(s.machinesDir, other))
  }
  const st = statfsSync(s.machinesDir)
  const free = st.bavail * st.bsize * Math.max(1, s.diskOvercommit)
  if (free < promised)
    throw new Error(
      `the host's disk has ${st.bavail * st.bsize} bytes free (${s.diskOvercommit}× promised), and its machines may still need ${promised} (this one ${diskBytes})`,
    )
}

/**
 * The machine's first files (owned by its root), in the folder `seed` of its own, which
 * `machine-root.pl` moves onto its disk.
 * Written synchronously, as the folder's other small files: a dozen steps each awaited took 25–50 ms
 * in all while other runs kept the host agent's thread busy (each waited its turn), against well
 * under a millisecond of work.
 */
const seed = (dir: string, hostId: number, spec: MachineSpec, guestAddress: string) => {
  const root = join(dir, "seed")
  const upper = join(root, "upper")
  // Every machine starts with an empty input and output folder, agent or not.
  for (const d of ["upper/etc/ssh", "upper/run/sshd", "upper/workspace/in", "upper/workspace/out", "work"])
    mkdirSync(join(root, d), { recursive: true })
  writeFileSync(join(upper, "etc/ssh/hangar_host_key"), spec.hostKey, { mode: 0o600 })
  writeFileSync(join(upper, "etc/ssh/hangar_authorized_keys"), `${spec.authorizedKey.trim()}\n`)
  writeFileSync(join(upper, "etc/ssh/sshd_config"), guestSshdConfig(guestAddress))
  // Folders that exist in the base keep the base's mode; these are the overlay's own.
  chmodSync(join(upper, "run/sshd"), 0o755)
  // Everything in it is the machine root's (here, not with `chown -R`: one tool run fewer).
  const owned = (path: string): void => {
    lchownSync(path, hostId, hostId)
    for (const e of readdirSync(path, { withFileTypes: true }))
      e.isDirectory() ? owned(join(path, e.name)) : lchownSync(join(path, e.name), hostId, hostId)
  }
  owned(root)
}

/**
 * The seccomp filter crun compiled from the profile's section for a machine of this process (the
 * filter's bytes, base64), which later machines hand to crun as they are (`Oci.configOf`'s
 * `seccompFilter`). crun writes what it loads into the container's state folder (the host's run
 * folder, which no machine sees) before the container's first process starts; the filter is the
 * section's, whatever machine it was compiled for. Kept for the section object (the profile file
 * is read once per process) and the crun it was compiled by.
 */
let compiled: { readonly seccomp: Oci.OciSeccomp; readonly crun: string; readonly filter: string } | undefined

const compiledFilter = (s: Settings, seccomp: Oci.OciSeccomp): string | undefined =>
  compiled !== undefined && compiled.seccomp === seccomp && compiled.crun === s.crun
    ? compiled.filter
    : undefined

/** Keeps the filter crun compiled for machine `id`, when it wrote one (whole BPF instructions). */
const keepFilter = (s: Settings, seccomp: Oci.OciSeccomp, id: string) => {
  try {
    const filter = readFileSync(join(crunRoot(s), id, "seccomp.bpf"))
    if (filter.length > 0 && filter.length % 8 === 0)
      compiled = { seccomp, crun: s.crun, filter: filter.toString("base64") }
  } catch {
    // none written: the next machine compiles the section again
  }
}

const createNow = async (
  s: Settings,
  policy: Policy.PolicySettingsValue,
  spec: MachineSpec,
  job: Job,
): Promise<Machine> => {
  const limits = limitsOf(spec)
  const dir = join(s.machinesDir, spec.id)
  let step = "folder"
  // The machine's network rules, placed while its disk and container are made (they match its
  // interface by name); awaited before the machine is handed out, and before any cleanup.
  let rules: Promise<void> | undefined
  try {
    // Searchable by all: the container's own root (an unprivileged id) reaches its mounts through it.
    await machineFolder(s.machinesDir, spec.id, spec.owner, 0o755) // fails if the id is in use
    for (const d of ["disk", "lower", "root"]) mkdirSync(join(dir, d))

    step = "disk room"
    writeFileSync(join(dir, "reserved"), String(limits.diskBytes))
    checkDiskRoom(s, spec.id, limits.diskBytes)

    step = "network"
    const net = await Net.lease(s.runDir, s.addressPool, spec.id)
    const hostId = hostIdOf(s, net.slot)
    rules = Policy.attachRules(policy, { iface: net.hostIf, guestAddress: net.guestAddress })
    rules.catch(() => undefined) // awaited below

    step = "ssh"
    const hostKey = ssh2.utils.parseKey(spec.hostKey)
    if (hostKey instanceof Error) throw hostKey
    const hostPublic = `${hostKey.type} ${hostKey.getPublicSSH().toString("base64")}`

    // The disk is a copy of the empty one of its size, made by `machine-root.pl` with its first
    // files moved onto it (below).
    step = "disk"
    const template = await Disks.workspaceTemplate(join(s.runDir, "disks"), limits.diskBytes)
    seed(dir, hostId, spec, net.guestAddress)

    // The disk's throttle is set once `machine-root.pl` has put it on a loop device (below).
    step = "cgroups"
    await Cgroups.make(s.cgroupRoot, spec.id, {
      ...limits,
      pids: hostLimits(s).pidsMax,
      guestOwner: hostId,
      // Wanted meanwhile: the job is no longer in the background (`want`).
      ...(job.background ? { cpuWeight: BACKGROUND_WEIGHT } : {}),
    })

    step = "container"
    const cpus = cpusOf(limits.vcpus, pinnedNow(s))
    const seccomp = Oci.seccompFromFile(s.seccompProfile)
    const seccompFilter = compiledFilter(s, seccomp)
    writeFileSync(
      join(dir, "config.json"),
      JSON.stringify(
        Oci.configOf({
          id: spec.id,
          hostId,
          cgroupsPath: `/hangar/${spec.id}`,
          guestMemoryCgroup: Cgroups.guestGroupOf(s.cgroupRoot, spec.id),
          shmBytes: Math.floor(limits.memoryBytes / 2),
          seccomp,
          ...(seccompFilter === undefined ? {} : { seccompFilter }),
          ...((await Lxcfs.ensure()) ? { lxcfs: { mount: Lxcfs.MOUNT, procFiles: Lxcfs.procFiles } } : {}),
          ...(cpus === undefined ? {} : { cpus }),
          // `-r`: the one connection (the host agent's) is served by a fork, not a re-exec of sshd
          // (~6 ms of every connect on bookworm's OpenSSH 9.2; OpenSSH 10 ignores it with a note).
          args: ["/usr/sbin/sshd", "-D", "-e", "-r", "-f", "/etc/ssh/sshd_config"],
        }),
      ),
    )
    // Looked at once lxcfs is known to serve (its start turns the setting off), before crun puts
    // the machine in its groups.
    await Cgroups.favorDynamicChanges()
    const code = await launch(
      "perl",
      [machineRoot, dir, template, spec.base, String(hostId), String(Oci.ID_COUNT), crunRoot(s), spec.id],
      {
        log: join(dir, "machine.log"),
        env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
        // crun from the tool runner's sealed copy: it starts once, not twice (`exec.ts` `launch`).
        sealed: s.crun,
      },
    )
    if (code !== 0) {
      // Whatever failed, the next machine compiles the section again: a kept filter crun refused
      // would otherwise fail every machine after it.
      compiled = undefined
      throw new Error(
        `the container was not created: ${(await fs.readFile(join(dir, "machine.log"), "utf8")).slice(-2000)}`,
      )
    }
    if (seccompFilter === undefined) keepFilter(s, seccomp, spec.id)
    const pid = Number(readFileSync(join(dir, "pid"), "utf8").trim())
    // Made by a tool at this thread's nice: the machine's processes run at the host agent's (its
    // group's weight holds back a background machine's).
    try {
      setPriority(pid, normalNice())
    } catch {
      // it ended: the steps below say so
    }

    step = "disk throttle"
    Cgroups.throttleDisk(s.cgroupRoot, spec.id, {
      device: Cgroups.deviceOf(readFileSync(join(dir, "loop"), "utf8").trim()),
      bytesPerSecond: limits.vcpus * s.diskBytesPerSecondPerVcpu,
      opsPerSecond: limits.vcpus * s.diskOpsPerSecondPerVcpu,
    })

    // The container made its network namespace (owned by its user namespace, so its sysfs shows
    // its own interfaces only); the veth goes into it while its first program, sshd, starts (it
    // binds the guest's address before eth0 has it: `ip_nonlocal_bind`, `Oci.ts`). Nothing reaches
    // the machine or leaves it before its interface is there, and the machine is handed out (and
    // logged into) only once its network, shaping and rules are all in place. Until then sshd is
    // all that runs in it: no tenant's program starts before the host agent's first login.
    step = "network"
    await Net.up(net, { pid, bytesPerSecond: limits.vcpus * s.networkBytesPerSecondPerVcpu })
    step = "policy"
    await rules
    await Policy.forward(policy, net.hostIf)

    step = "ready"
    const until = Date.now() + s.readyTimeoutMs
    while (!listening(pid, net.guestAddress, 22)) {
      if (!(await alive(pid)) || Date.now() > until) {
        const tail = readFileSync(join(dir, "machine.log"), "utf8")
        throw new Error(`sshd did not start: ${tail.slice(-2000)}`)
      }
      await sleep(1)
    }
    return {
      id: spec.id,
      size: spec.size,
      limits,
      ssh: { host: net.guestAddress, port: 22, hostKey: hostPublic },
      handle: { pid, dir, netns: net.netns, hostIf: net.hostIf, hostAddress: net.hostAddress, hostId },
    }
  } catch (e) {
    const detail = messageOf(e)
    // Rules still being placed would land after the cleanup removed them.
    await rules?.catch(() => undefined)
    if (step !== "folder" || !detail.includes("EEXIST"))
      await destroyNow(s, policy, spec.id).catch(() => undefined)
    throw new MachineCreateFailed({ id: spec.id, step, detail })
  }
}

/**
 * What the machine thread is asked: to make a machine, or to remove one (answered); or that a
 * machine made or being made in the background is wanted now (not answered); or, for tests, the
 * nice values it runs at.
 */
type ThreadJob =
  | ({ readonly settings: Settings; readonly policy: Policy.PolicySettingsValue } & (
      | { readonly op: "create"; readonly spec: MachineSpec }
      | { readonly op: "destroy"; readonly id: string }
    ))
  | { readonly op: "want"; readonly cgroupRoot: string; readonly id: string }
  | { readonly op: "priority" }
type ThreadRequest = ThreadJob & { readonly seq: number }

/** What it answers: the machine made (none for a removal), its priority when asked, or the step that failed and why. */
type ThreadAnswer =
  | { readonly seq: number; readonly ok: true; readonly machine?: Machine; readonly priority?: Priority }
  | { readonly seq: number; readonly ok: false; readonly step?: string; readonly detail: string }

/** The nice values the machine thread and its tool runner run at, as the kernel has them (tests). */
export interface Priority {
  readonly thread: number
  /** None while no tool runner is started. */
  readonly tools?: number
}

/** A job under way on the machine thread: its machine, and whether it is background work. */
interface Job {
  readonly id: string
  background: boolean
}

/** On the machine thread: its jobs under way, by request. */
const underWay = new Map<number, Job>()
let threadNice: number | undefined
/** On the machine thread: its own id (a nice is a thread's own; `/proc/thread-self` is `<pid>/task/<tid>`). */
let threadId: number | undefined

/**
 * On the machine thread: `backgroundNice` for the thread and its tools while every job under way
 * is background work, else the host agent's own. Idle, it stays as it was: the next job sets it
 * before its first step.
 */
const prioritize = () => {
  if (underWay.size === 0) return
  const nice = [...underWay.values()].every((j) => j.background) ? backgroundNice() : normalNice()
  if (nice === threadNice) return
  // Taken as set even where it was not (only a host agent without CAP_SYS_NICE is refused, and
  // this driver runs as root): its work goes on either way.
  threadNice = nice
  setToolNice(nice)
  try {
    threadId ??= Number(readlinkSync("/proc/thread-self").split("/")[2])
    setPriority(threadId, nice)
  } catch {
    // Not allowed back: see above.
  }
}

/** On the machine thread: machine `id` is wanted; its making, if under way, and its group are no longer background. */
const want = (cgroupRoot: string, id: string) => {
  for (const job of underWay.values()) if (job.id === id) job.background = false
  prioritize()
  try {
    Cgroups.setCpuWeight(cgroupRoot, id, NORMAL_WEIGHT)
  } catch {
    // being removed
  }
}

/** The machine thread's side: does what it is asked, and answers what came of it. */
const serve = async (r: ThreadRequest & { readonly op: "create" | "destroy" }): Promise<ThreadAnswer> => {
  // A removal is never background work: it gives back room a run may wait for.
  const job: Job =
    r.op === "create"
      ? { id: r.spec.id, background: r.spec.background === true }
      : { id: r.id, background: false }
  underWay.set(r.seq, job)
  try {
    prioritize()
    if (r.op === "create")
      return { seq: r.seq, ok: true, machine: await createNow(r.settings, r.policy, r.spec, job) }
    await destroyNow(r.settings, r.policy, r.id)
    return { seq: r.seq, ok: true }
  } catch (e) {
    if (e instanceof MachineCreateFailed) return { seq: r.seq, ok: false, step: e.step, detail: e.detail }
    return { seq: r.seq, ok: false, detail: messageOf(e) }
  } finally {
    underWay.delete(r.seq)
    prioritize()
  }
}

/**
 * The machine thread's program: this file and what it imports, bundled by esbuild into one
 * CommonJS text, once per process (each file keeps its own `import.meta.url`, so the tools beside
 * it are found). The thread runs it in about 0.3 s of CPU; loaded through tsx, effect's modules one
 * by one took it 3.5 s.
 */
let program: Promise<string> | undefined
const threadProgram = (): Promise<string> => {
  program ??= (async () => {
    const [esbuild, { sourceUrls }] = await Promise.all([
      import("esbuild"),
      import("../../../core/SourceUrls.mjs"),
    ])
    const built = await esbuild.build({
      entryPoints: [fileURLToPath(import.meta.url)],
      bundle: true,
      platform: "node",
      format: "cjs",
      target: "node20",
      // ssh2's optional native crypto (the thread only reads keys with it), and esbuild itself
      // (only this side bundles).
      external: ["*.node", "esbuild"],
      plugins: [sourceUrls],
      write: false,
      logLevel: "silent",
    })
    const text = built.outputFiles[0]?.text
    if (text === undefined) throw new Error("esbuild made no machine thread program")
    return text
  })()
  // A bundling that failed is tried again at the next request.
  program.catch(() => {
    program = undefined
  })
  return program
}

let thread: Worker | undefined
let nextSeq = 0
const asked = new Map<number, (answer: ThreadAnswer) => void>()

/**
 * The machine thread, started on first use and again if it ever ends (its requests then fail).
 * Idle, it keeps no one alive, as the tool runner (`exec.ts`): a process ends when its own work is
 * done. It shares the process's environment; everything else it needs comes with each request.
 */
const machineThread = async (): Promise<Worker> => {
  const text = await threadProgram()
  if (thread !== undefined) return thread
  const worker = new Worker(text, { eval: true, env: SHARE_ENV, workerData: { machineThread: true } })
  worker.on("message", (answer: ThreadAnswer) => {
    const waiter = asked.get(answer.seq)
    asked.delete(answer.seq)
    if (asked.size === 0) worker.unref()
    waiter?.(answer)
  })
  const gone = (why: string) => {
    if (thread !== worker) return
    thread = undefined
    for (const [seq, waiter] of asked) waiter({ seq, ok: false, detail: `the machine thread ${why}` })
    asked.clear()
  }
  worker.on("error", (e) => gone(`failed: ${e.message}`))
  worker.on("exit", (code) => gone(`exited (${code})`))
  worker.unref()
  thread = worker
  return worker
}

/** Ends the machine thread as a crash would (tests): what it was asked and did not answer fails. */
export const endMachineThread = async (): Promise<void> => {
  await thread?.terminate()
}

/** What the machine thread did not do: the step of a create that failed, and why. */
class ThreadFailed extends Error {
  constructor(
    readonly step: string | undefined,
    detail: string,
  ) {
    super(detail)
  }
}

/**
 * Asks the machine thread for `job` (made when it is sent: after the thread started), and answers
 * what `answer` takes of its answer: by default the machine a create made (a removal: nothing).
 */
const inThread = <A>(
  job: () => ThreadJob,
  answer: (a: ThreadAnswer & { ok: true }) => unknown = (a) => a.machine,
) =>
  machineThread().then(
    (worker) =>
      new Promise<A>((ok, fail) => {
        const seq = nextSeq++
        asked.set(seq, (a) => (a.ok ? ok(answer(a) as A) : fail(new ThreadFailed(a.step, a.detail))))
        worker.ref()
        worker.postMessage({ ...job(), seq } satisfies ThreadRequest)
      }),
  )

/** The nice values the machine thread and its tool runner run at now (tests). */
export const machineThreadPriority = (): Promise<Priority> =>
  inThread(
    () => ({ op: "priority" }),
    (a) => a.priority,
  )

/** The driver with the given settings; machine networks follow `policy` (the defaults unless given). */
export const make = (
  s: Settings,
  policy: Policy.PolicySettingsValue = Policy.PolicySettings.defaults,
): MachineDriverService => {
  // The machines made in the background and not wanted yet (`wanted`).
  const behind = new Set<string>()
  return {
    kind: "namespace",
    create: (spec) =>
      Effect.tryPromise({
        try: () => {
          if (spec.background === true) behind.add(spec.id)
          // Wanted before the request is sent: made as any run's.
          return inThread<Machine>(() => ({
            op: "create",
            settings: s,
            policy,
            spec: { ...spec, background: behind.has(spec.id) },
          })).catch((e) => {
            behind.delete(spec.id)
            throw e
          })
        },
        catch: (e) =>
          new MachineCreateFailed({
            id: spec.id,
            step: (e instanceof ThreadFailed ? e.step : undefined) ?? "?",
            detail: messageOf(e),
          }),
      }).pipe(Effect.withSpan("NamespaceDriver.create")),
    wanted: (id) =>
      Effect.sync(() => {
        if (!behind.delete(id)) return
        // Made: its group's weight, from here (the thread may be busy making another).
        try {
          Cgroups.setCpuWeight(s.cgroupRoot, id, NORMAL_WEIGHT)
        } catch {
          // being removed
        }
        // Being made (its request sent, so the thread has it before this): what is left of its
        // making, there; the thread sets the weight again, should its making set it after the line
        // above.
        thread?.postMessage({ op: "want", cgroupRoot: s.cgroupRoot, id, seq: -1 } satisfies ThreadRequest)
      }),
    destroy: (id) =>
      Effect.tryPromise({
        try: () => {
          behind.delete(id)
          return inThread<void>(() => ({ op: "destroy", settings: s, policy, id }))
        },
        catch: (e) => new MachineDestroyFailed({ id, detail: messageOf(e) }),
      }),
    owned: (owner) => ownedIn(s.machinesDir, owner),
    claim: claimIn(s.machinesDir),
    keep: keepIn(s.machinesDir),
    adopt: adoptIn(s.machinesDir),
  }
}

/** The namespace driver as the host's MachineDriver. */
export const layer = Layer.effect(
  MachineDriver,
  Effect.gen(function* () {
    const s = yield* NamespaceDriverSettings.Tag
    // Optional, so hosts that do not configure the network policy get its defaults.
    const policy = yield* Effect.serviceOption(Policy.PolicySettings.Tag)
    // The host's machine thread is started with it, so its first machine does not wait for it.
    yield* Effect.sync(() => machineThread().catch(() => undefined))
    return make(
      s,
      Option.getOrElse(policy, () => Policy.PolicySettings.defaults),
    )
  }),
)

// On the machine thread (its program is this file, bundled), requests are served.
if (!isMainThread && (workerData as { machineThread?: unknown } | null)?.machineThread === true)
  parentPort?.on("message", (r: ThreadRequest) => {
    if (r.op === "want") return want(r.cgroupRoot, r.id)
    if (r.op === "priority") {
      const tools = toolRunnerPid()
      return parentPort?.postMessage({
        seq: r.seq,
        ok: true,
        priority: {
          thread: niceIn("/proc/thread-self/stat") ?? Number.NaN,
          ...(tools === undefined ? {} : { tools: niceIn(`/proc/${tools}/stat`) ?? Number.NaN }),
        },
      } satisfies ThreadAnswer)
    }
    void serve(r).then((a) => parentPort?.postMessage(a))
  })
