/**
 * lxcfs (Debian's package): a FUSE file system that shows each process the `/proc` files of its
 * own cgroups, so `free`, `top` and `/proc/cpuinfo` in a machine show the machine's memory and
 * vCPUs, not the host's. One lxcfs serves every machine of the host; it is a host service like the
 * nftables table, started by the first machine that needs it and left running (machines made while
 * it runs have its files bound over their `/proc` files).
 */
import { spawn } from "node:child_process"
import { access, constants, mkdir, readFile } from "node:fs/promises"
import { join } from "node:path"
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

const serving = () =>
  readFile(join(MOUNT, "proc", "meminfo"), "utf8").then(
    (text) => text.includes("MemTotal"),
    () => false,
  )

let started: Promise<boolean> | undefined

const start = async (): Promise<boolean> => {
  if (await serving()) return true
  try {
    await access("/usr/bin/lxcfs", constants.X_OK)
  } catch {
    return false
  }
  await mkdir(MOUNT, { recursive: true })
  // A dead lxcfs leaves its mount behind ("transport endpoint is not connected").
  await run("umount", ["-l", MOUNT]).catch(() => undefined)
  // lxcfs daemonizes itself once mounted; a second start (another host agent racing) fails and
  // finds the first serving.
  const child = spawn(
    "/usr/bin/lxcfs",
    ["--enable-cfs", "--enable-loadavg", "--disable-swap", "--pidfile", "/run/hangar-lxcfs.pid", MOUNT],
    { detached: true, stdio: "ignore" },
  )
  child.on("error", () => undefined)
  child.unref()
  for (let i = 0; i < 500; i++) {
    if (await serving()) return true
    await sleep(10)
  }
  return false
}

/** Whether lxcfs serves (starting it when it does not); `false` when it is not installed or will not start. */
export const ensure = async (): Promise<boolean> => {
  if (started !== undefined && (await started) && (await serving())) return true
  started = start()
  return started
}
