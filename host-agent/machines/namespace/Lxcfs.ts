/**
 * lxcfs (Debian's package): a FUSE file system that shows each process the `/proc` files of its
 * own cgroups, so `free`, `top` and `/proc/cpuinfo` in a machine show the machine's memory and
 * vCPUs, not the host's. One lxcfs serves every machine of the host; it is a host service like the
 * nftables table, started by the first machine that needs it and left running (machines made while
 * it runs have its files bound over their `/proc` files).
 */
import { spawn } from "node:child_process"
import { readdirSync, readFileSync, readlinkSync } from "node:fs"
import { access, constants, mkdir, readFile } from "node:fs/promises"
import { getPriority } from "node:os"
import { join } from "node:path"
import { mountsOf, normalNice, statFields } from "../HostFiles.ts"
import { run } from "./exec.ts"

/** Where lxcfs is mounted (Debian's default). */
export const MOUNT = "/var/lib/lxcfs"

/** The `/proc` files lxcfs virtualizes, each bound over the machine's own. */
export const procFiles: ReadonlyArray<string> = [
  "cpuinfo",
  "diskstats",
  "loadavg",
  "meminfo",
  "stat",
  "swaps",
  "uptime",
]

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const readlinkOr = (path: string): string | undefined => {
  try {
    return readlinkSync(path)
  } catch {
    return undefined
  }
}

const serving = (mount: string) =>
  readFile(join(mount, "proc", "meminfo"), "utf8").then(
    (text) => text.includes("MemTotal"),
    () => false,
  )

/**
 * Whether the lxcfs `pidFile` names runs and an lxcfs FUSE mount is at `mount`, found without
 * reading the mount (a read is a FUSE round trip and four steps of the host agent's thread, each
 * waiting its turn: ~7 ms of a machine's start while runs keep it busy; and an lxcfs that hangs
 * would hang a synchronous reader).
 */
const knownServing = (mount: string, pidFile: string): boolean => {
  try {
    const pid = Number(readFileSync(pidFile, "utf8").trim())
    if (!(pid > 0)) return false
    // `<pid> (lxcfs) <state> …`: running, not a killed one not yet reaped (`Z`).
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const state = statFields(stat)[0]
    if (!stat.startsWith(`${pid} (lxcfs) `) || state === "Z" || state === "X") return false
    // A killed lxcfs is not a zombie at once: it still exits for a while after it let go of its
    // FUSE device, and the mount died then. Serving means holding the device.
    const fds = `/proc/${pid}/fd`
    if (!readdirSync(fds).some((fd) => readlinkOr(`${fds}/${fd}`) === "/dev/fuse")) return false
    return mountsOf(readFileSync("/proc/self/mountinfo", "utf8")).some(
      (m) => m.point === mount && m.type === "fuse.lxcfs",
    )
  } catch {
    return false
  }
}

const starts = new Map<string, Promise<boolean>>()

const start = async (mount: string, pidFile: string): Promise<boolean> => {
  if (await serving(mount)) return true
  try {
    await access("/usr/bin/lxcfs", constants.X_OK)
  } catch {
    return false
  }
  try {
    // A dead lxcfs (killed with the processes of a session, or crashed) leaves its mount behind:
    // every access to it, even mkdir of the mount point, fails ENOTCONN ("transport endpoint is not
    // connected"; ECONNABORTED just after) until it is unmounted. Only such a mount is taken away.
    const isDead = (e: NodeJS.ErrnoException) => e.code === "ENOTCONN" || e.code === "ECONNABORTED"
    await mkdir(mount, { recursive: true }).catch(async (e: NodeJS.ErrnoException) => {
      if (!isDead(e)) throw e
      await run("umount", ["-l", mount])
      await mkdir(mount, { recursive: true })
    })
    // lxcfs daemonizes itself once mounted; a second start (another host agent racing) fails and
    // finds the first serving. It serves every machine, at the host agent's nice: `nice` sets that
    // before its exec, since the thread starting it may be making a machine in the background
    // (niced), and all lxcfs forks and threads would keep that for good.
    const child = spawn(
      "nice",
      [
        ...["-n", String(normalNice() - getPriority())],
        ...[
          "/usr/bin/lxcfs",
          "--enable-cfs",
          "--enable-loadavg",
          "--disable-swap",
          "--pidfile",
          pidFile,
          mount,
        ],
      ],
      { detached: true, stdio: "ignore" },
    )
    child.on("error", () => undefined)
    child.unref()
    for (let i = 0; i < 500; i++) {
      if (await serving(mount)) return true
      await sleep(10)
    }
  } catch {
    // lxcfs only makes `free` and `nproc` show the machine's size: a machine is made without it.
  }
  return false
}

/**
 * Whether lxcfs serves at `mount` (starting it when it does not, and restarting it when it died);
 * `false` when it is not installed or will not start, and the machine is made without it.
 */
export const ensure = async (mount = MOUNT, pidFile = "/run/hangar-lxcfs.pid"): Promise<boolean> => {
  const earlier = starts.get(mount)
  if (earlier !== undefined) {
    const ok = (await earlier) && (knownServing(mount, pidFile) || (await serving(mount)))
    // Another caller started it again meanwhile: that start is the one to wait for.
    if (starts.get(mount) !== earlier) return ensure(mount, pidFile)
    if (ok) return true
  }
  // Checked and set with no await between: one start at a time per mount.
  const now = start(mount, pidFile)
  starts.set(mount, now)
  return now
}
