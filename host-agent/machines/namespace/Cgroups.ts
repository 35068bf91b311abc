/**
 * cgroup v1 limits of one machine under `<root>/<hierarchy>/hangar/<id>`: `memory`, `cpu`, `pids`
 * and `blkio` (its disk's bandwidth and operations per second) are set here; crun joins the
 * machine to these groups and makes its own in the other hierarchies (`devices` holds its device
 * list). The memory group has a child `cmds`, owned by the machine's root, that the machine sees as
 * `/sys/fs/cgroup/memory`: each `bash` command runs in its own group below it, so an OOM kill is
 * charged to the command that caused it, while the limit stays on the machine's group, out of the
 * guest's reach (its cgroup namespace and mount show it nothing above `cmds`).
 *
 * The files here are cgroupfs's: the kernel answers each at once, without disk I/O. So they are
 * read and written synchronously. Asynchronous, each of the few dozen a machine's start or end
 * touches went to libuv's thread pool, and under back-to-back runs queued there behind the disk
 * work of other machines being made and removed.
 */
import * as fs from "node:fs"
import { basename, join } from "node:path"
import { mountsOf, readText } from "../HostFiles.ts"
import { run } from "./exec.ts"

/** The hierarchies whose limits the driver sets itself. */
export const controllers = ["memory", "cpu", "pids", "blkio"] as const

/** The machine's group folder for `controller`. */
export const groupOf = (root: string, controller: string, id: string) => join(root, controller, "hangar", id)

/** The folder the guest sees as its memory cgroup root. */
export const guestGroupOf = (root: string, id: string) => join(groupOf(root, "memory", id), "cmds")

/** `major:minor` of a block device (`/dev/loop3`). */
export const deviceOf = (dev: string): string =>
  fs.readFileSync(join("/sys/class/block", basename(dev), "dev"), "utf8").trim()

/** A machine's disk (`major:minor`) and its limits, both ways. */
export interface DiskLimits {
  readonly device: string
  readonly bytesPerSecond: number
  readonly opsPerSecond: number
}

/** What one machine may use. */
export interface Limits {
  readonly memoryBytes: number
  readonly vcpus: number
  readonly pids: number
  /** The host uid of the machine's root: it owns `cmds`, so the guest can make its commands' groups. */
  readonly guestOwner?: number
  /** The group's CPU weight against others (`cpu.shares`); the kernel's 1,024 unless given. */
  readonly cpuWeight?: number
}

/** Makes the groups and sets the limits. */
export const make = async (root: string, id: string, limits: Limits): Promise<void> => {
  for (const c of controllers) fs.mkdirSync(groupOf(root, c, id), { recursive: true })
  fs.writeFileSync(join(groupOf(root, "memory", id), "memory.limit_in_bytes"), String(limits.memoryBytes))
  // No swap beyond the memory limit (where the host has swap accounting at all).
  try {
    fs.writeFileSync(
      join(groupOf(root, "memory", id), "memory.memsw.limit_in_bytes"),
      String(limits.memoryBytes),
    )
  } catch {
    // no swap accounting on this host
  }
  const guest = guestGroupOf(root, id)
  fs.mkdirSync(guest)
  if (limits.guestOwner !== undefined) {
    const owner = limits.guestOwner
    fs.chownSync(guest, owner, owner)
    for (const f of ["cgroup.procs", "tasks"]) fs.chownSync(join(guest, f), owner, owner)
    // The groups of a session's first two commands (`GuestSession`'s wrapper makes `p<slot>` when
    // it is missing; its first wrapper and spare take slots 0 and 1), owned by the machine's root
    // as if it had made them: a machine's first commands start no `mkdir` (~5 ms of CPU each).
    for (const k of [0, 1]) {
      const group = join(guest, `p${k}`)
      fs.mkdirSync(group)
      fs.chownSync(group, owner, owner)
      for (const f of fs.readdirSync(group)) fs.chownSync(join(group, f), owner, owner)
    }
  }
  fs.writeFileSync(join(groupOf(root, "cpu", id), "cpu.cfs_period_us"), "100000")
  fs.writeFileSync(join(groupOf(root, "cpu", id), "cpu.cfs_quota_us"), String(limits.vcpus * 100000))
  if (limits.cpuWeight !== undefined) setCpuWeight(root, id, limits.cpuWeight)
  fs.writeFileSync(join(groupOf(root, "pids", id), "pids.max"), String(limits.pids))
}

/** Sets the machine's CPU weight (`cpu.shares`); answers false when its group is not there. */
export const setCpuWeight = (root: string, id: string, weight: number): boolean => {
  try {
    fs.writeFileSync(join(groupOf(root, "cpu", id), "cpu.shares"), String(weight))
    return true
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return false
    throw e
  }
}

/** Limits the machine's disk, in its `blkio` group (made by `make`). */
export const throttleDisk = (root: string, id: string, disk: DiskLimits): void => {
  const blkio = groupOf(root, "blkio", id)
  for (const [file, value] of [
    ["blkio.throttle.read_bps_device", disk.bytesPerSecond],
    ["blkio.throttle.write_bps_device", disk.bytesPerSecond],
    ["blkio.throttle.read_iops_device", disk.opsPerSecond],
    ["blkio.throttle.write_iops_device", disk.opsPerSecond],
  ] as const)
    fs.writeFileSync(join(blkio, file), `${disk.device} ${value}`)
}

/**
 * Lifts the machine's disk throttles, so processes waiting on throttled I/O (uninterruptible)
 * finish it at once and can be killed; a no-op when there are none.
 */
export const unthrottle = async (root: string, id: string): Promise<void> => {
  const blkio = groupOf(root, "blkio", id)
  for (const file of [
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
    "blkio.throttle.read_iops_device",
    "blkio.throttle.write_iops_device",
  ]) {
    for (const line of readOr(join(blkio, file)).split("\n")) {
      const device = line.trim().split(/\s+/)[0]
      if (device) {
        try {
          fs.writeFileSync(join(blkio, file), `${device} 0`)
        } catch {
          // the device is gone: nothing left to lift
        }
      }
    }
  }
}

/** The hierarchies mounted under `root` (crun makes a machine's group in each). */
export const hierarchies = (root: string): Array<string> => {
  try {
    return fs
      .readdirSync(root, { withFileTypes: true })
      .filter((e) => e.isDirectory() || e.isSymbolicLink())
      .map((e) => e.name)
  } catch {
    return []
  }
}

/** A cgroupfs file's text, or "" when it (or its group) is not there. */
const readOr = (path: string): string => readText(path) ?? ""

/** The group folders of a machine, deepest first. */
const allGroups = (root: string, id: string, among = hierarchies(root)): Array<string> => {
  const out: Array<string> = []
  const walk = (dir: string) => {
    let entries: Array<fs.Dirent>
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true })
    } catch {
      return
    }
    for (const e of entries) if (e.isDirectory()) walk(join(dir, e.name))
    out.push(dir)
  }
  for (const c of among) walk(groupOf(root, c, id))
  return out
}

/**
 * Every process in the machine's groups. In cgroup v1 each process is in one group of every
 * hierarchy, and a machine's processes can move only within the groups its root owns (`cmds`, in
 * the memory hierarchy): so the machine's `pids` subtree holds every one of them, and is the one
 * looked at (a dozen hierarchies walked took ~1 ms, and a machine's end looks several times).
 * Every hierarchy is looked at on a host without `pids`.
 */
export const tasks = async (root: string, id: string): Promise<Array<number>> => {
  const pids = new Set<number>()
  const one = fs.existsSync(groupOf(root, "pids", id)) ? ["pids"] : hierarchies(root)
  for (const dir of allGroups(root, id, one))
    for (const line of readOr(join(dir, "cgroup.procs")).split("\n")) if (line) pids.add(Number(line))
  return [...pids]
}

/** The number of OOM kills in the machine's memory group (its own processes, not its commands'). */
export const oomKills = async (root: string, id: string): Promise<number> => {
  const text = readOr(join(groupOf(root, "memory", id), "memory.oom_control"))
  return Number(/oom_kill (\d+)/.exec(text)?.[1] ?? 0)
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/**
 * Signals every process with SIGTERM, waits up to `graceMs`, then SIGKILLs until none is left.
 * Looked at again after 1, 2, 4 and 8 ms, then every 10 ms: a machine's sshd and shells end within
 * a few milliseconds of the signal.
 */
export const killAll = async (root: string, id: string, graceMs: number): Promise<void> => {
  const signal = async (sig: NodeJS.Signals) => {
    const pids = await tasks(root, id)
    for (const pid of pids) {
      try {
        process.kill(pid, sig)
      } catch {
        // already gone
      }
    }
    return pids.length
  }
  if ((await signal("SIGTERM")) === 0) return
  const termUntil = Date.now() + graceMs
  for (let pause = 1; Date.now() < termUntil; pause = Math.min(10, pause * 2)) {
    await sleep(pause)
    if ((await tasks(root, id)).length === 0) return
  }
  const killUntil = Date.now() + 10_000
  while ((await signal("SIGKILL")) > 0) {
    if (Date.now() > killUntil) throw new Error(`processes left in cgroup hangar/${id}`)
    await sleep(10)
  }
}

/** Removes the machine's groups (deepest first), retrying while exiting processes release them. */
export const remove = async (root: string, id: string): Promise<void> => {
  const until = Date.now() + 5_000
  for (const dir of allGroups(root, id)) {
    for (;;) {
      try {
        fs.rmdirSync(dir)
        break
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code
        if (code === "ENOENT") break
        if (Date.now() > until) throw new Error(`cannot remove cgroup ${dir}: ${code}`)
        await sleep(10)
      }
    }
  }
}

/** A cgroup2 mount to remount with `favordynmods`: its folder and the options to remount it with. */
export interface Remount {
  readonly mountPoint: string
  readonly options: string
}

/**
 * The writable cgroup2 mounts of `mountinfo` (`/proc/self/mountinfo`'s text) without
 * `favordynmods`, each with the options that add it and keep its others (`nsdelegate`,
 * `memory_recursiveprot`…: a remount drops the superblock options it is not given). Its own
 * options (`nosuid`…) are kept by `mount` itself.
 */
export const toFavorDynmods = (mountinfo: string): Array<Remount> =>
  mountsOf(mountinfo)
    .filter(
      (m) =>
        m.type === "cgroup2" &&
        !m.superOptions.includes("favordynmods") &&
        // A read-only one is left as it is: a remount is no place to risk making it writable.
        !m.options.includes("ro") &&
        !m.superOptions.includes("ro"),
    )
    .map((m) => ({
      mountPoint: m.point,
      options: ["remount", ...m.superOptions.filter((o) => o !== "rw"), "favordynmods"].join(","),
    }))

/**
 * Readies the host's cgroups for a machine's start: moving a process into a group (crun puts each
 * new machine into a dozen, and each command's wrapper moves into its own) waits by default for an
 * RCU grace period, 6–15 ms on the kernels it was measured on, paid by every machine's start. The
 * cgroup2 option `favordynmods` (Linux 6.0) trades that for a little more work in fork and exit: a
 * move then takes ~0.3 ms. (Linux 6.18.44 no longer waits: a move there is ~0.1 ms either way, as
 * is a machine's start; Debian 12's kernel, 6.1, has the wait the option was added for.) It is a
 * kernel-wide setting, turned on through any cgroup2 mount (on a hybrid host,
 * `/sys/fs/cgroup/unified`), and turned off again by any later mount of cgroup2 made without it:
 * lxcfs makes one each time it starts (the first machine's start may be what starts it), and so
 * may other programs of the host. So each machine's start looks (one read of
 * `mountinfo`, ~0.1 ms) and turns it on again when it finds it off. A host with no cgroup2 mount,
 * or that refuses, keeps the default: machines start, only slower.
 *
 * `favorer` makes one for a `mountinfo` file and a way to run `mount` (tests give their own);
 * `favorDynamicChanges` is the process's.
 */
export const favorer = (
  mountinfo: string,
  mount = (args: ReadonlyArray<string>): Promise<unknown> => run("mount", [...args]),
): (() => Promise<void>) => {
  /** A remount under way, which every start that finds the setting off waits for. */
  let favoring: Promise<void> | undefined
  /** Set once the kernel did not take it (the remount failed, or left it off): tried no more. */
  let refused = false
  return () => {
    if (favoring !== undefined || refused) return favoring ?? Promise.resolve()
    const remounts = toFavorDynmods(readText(mountinfo) ?? "")
    if (remounts.length === 0) return Promise.resolve()
    const now = (async () => {
      // One is enough (the setting is the kernel's); the first that takes it.
      for (const r of remounts) {
        const done = await mount(["-o", r.options, r.mountPoint]).then(
          () => true,
          () => false,
        )
        // A remount from outside the host's cgroup namespace succeeds and changes nothing.
        if (done && toFavorDynmods(readText(mountinfo) ?? "").length === 0) return
      }
      refused = true
    })().finally(() => {
      favoring = undefined
    })
    favoring = now
    return now
  }
}

export const favorDynamicChanges = favorer("/proc/self/mountinfo")
