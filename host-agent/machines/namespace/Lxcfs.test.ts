import { mkdir, mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Worker } from "node:worker_threads"
import { afterAll, describe, expect, it } from "vitest"
import { normalNice, threadNices } from "../HostFiles.ts"
import { backgroundNice } from "../MachineDriver.ts"
import { run } from "./exec.ts"
import * as Lxcfs from "./Lxcfs.ts"

// A session's end (or a crash) can take lxcfs with it and leave its FUSE mount behind; every access
// to the mount then fails ENOTCONN, mkdir of the mount point included. CI once failed every
// machine create on exactly that. This test uses a mount of its own, not the host's.
describe("lxcfs", () => {
  const dirs: Array<string> = []
  const pids: Array<number> = []

  afterAll(async () => {
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL")
      } catch {}
    }
    for (const dir of dirs) {
      await run("umount", ["-l", join(dir, "mnt")]).catch(() => undefined)
      await rm(dir, { recursive: true, force: true })
    }
  })

  it("serves at the host agent's nice when started by a thread making a machine in the background", async () => {
    const dir = await mkdtemp(join(tmpdir(), "hangar-lxcfs-"))
    dirs.push(dir)
    // A thread of this process as the machine thread is then (this module, bundled as the machine
    // thread's program is): niced, and what it starts inherits it; this thread, the host agent's
    // own, keeps its nice.
    const { build } = await import("esbuild")
    const { sourceUrls } = await import("../../../core/SourceUrls.mjs")
    const program = await build({
      stdin: {
        contents: `
          const { readlinkSync } = require("node:fs")
          const { setPriority } = require("node:os")
          const { parentPort, workerData } = require("node:worker_threads")
          const { ensure } = require("./Lxcfs.ts")
          setPriority(Number(readlinkSync("/proc/thread-self").split("/")[2]), workerData.nice)
          ensure(workerData.mount, workerData.pidFile).then((ok) => parentPort.postMessage(ok))`,
        resolveDir: import.meta.dirname,
        loader: "js",
      },
      bundle: true,
      platform: "node",
      format: "cjs",
      external: ["*.node"],
      plugins: [sourceUrls],
      write: false,
      logLevel: "silent",
    })
    const thread = new Worker(program.outputFiles[0]?.text ?? "", {
      eval: true,
      workerData: { nice: backgroundNice(), mount: join(dir, "mnt"), pidFile: join(dir, "lxcfs.pid") },
    })
    try {
      expect(await new Promise((ok, fail) => thread.once("message", ok).once("error", fail))).toBe(true)
    } finally {
      await thread.terminate()
    }
    const pid = Number((await readFile(join(dir, "lxcfs.pid"), "utf8")).trim())
    pids.push(pid)
    expect(threadNices(pid)).toEqual([normalNice()])
  })

  it("is started again over the mount a killed lxcfs left behind", async () => {
    const dir = await mkdtemp(join(tmpdir(), "hangar-lxcfs-"))
    dirs.push(dir)
    const mount = join(dir, "mnt")
    const pidFile = join(dir, "lxcfs.pid")
    expect(await Lxcfs.ensure(mount, pidFile)).toBe(true)
    const first = Number((await readFile(pidFile, "utf8")).trim())
    pids.push(first)
    expect(await readFile(join(mount, "proc", "meminfo"), "utf8")).toContain("MemTotal")

    process.kill(first, "SIGKILL")
    // The mount stays, and answers nothing.
    const stale = await (async () => {
      for (let i = 0; i < 200; i++) {
        const error = await mkdir(mount, { recursive: true }).then(
          () => undefined,
          (e: NodeJS.ErrnoException) => e.code,
        )
        if (error !== undefined) return error
        await new Promise((r) => setTimeout(r, 10))
      }
      return "still served"
    })()
    // ECONNABORTED while the kernel aborts the connection, ENOTCONN after.
    expect(["ENOTCONN", "ECONNABORTED"]).toContain(stale)

    // Machines made at once after it died: one lxcfs is started, and every one of them finds it.
    expect(await Promise.all([1, 2, 3, 4].map(() => Lxcfs.ensure(mount, pidFile)))).toEqual([
      true,
      true,
      true,
      true,
    ])
    const second = Number((await readFile(pidFile, "utf8")).trim())
    pids.push(second)
    expect(second).not.toBe(first)
    expect(await readFile(join(mount, "proc", "meminfo"), "utf8")).toContain("MemTotal")
    // One lxcfs serves the mount (no second daemon left without a mount).
    const serving = (await readFile("/proc/mounts", "utf8"))
      .split("\n")
      .filter((l) => l.includes(` ${mount} `))
    expect(serving).toHaveLength(1)

    // Running, it is known to serve from its process and the mount table, without a read of the
    // mount: a stopped lxcfs (a read would wait for it) holds no machine's start.
    process.kill(second, "SIGSTOP")
    try {
      const answer = await Promise.race([
        Lxcfs.ensure(mount, pidFile),
        new Promise((r) => setTimeout(() => r("no answer in 5 s"), 5_000)),
      ])
      expect(answer).toBe(true)
    } finally {
      process.kill(second, "SIGCONT")
    }
  })
})
