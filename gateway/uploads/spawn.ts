/**
 * Test and bench helpers around `testServer.ts`: start it as a child process, stream a generated
 * body of any size to an upload link without holding it, and read a process's resident memory.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { readFile } from "node:fs/promises"
import http from "node:http"
import { dirname, join } from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))

/** A gateway running in a child process. */
export interface ChildGateway {
  readonly url: string
  readonly account: string
  readonly token: string
  readonly pid: number
  /** Stops it (SIGTERM) and waits for it to exit. */
  readonly stop: () => Promise<void>
}

/** Starts `testServer.ts` in a child process and waits for its ready line. */
export const startChildGateway = async (options: {
  readonly natsUrl: string
  readonly prefix: string
  readonly dir: string
}): Promise<ChildGateway> => {
  const child: ChildProcess = spawn(
    process.execPath,
    ["--import", "tsx", join(here, "testServer.ts"), JSON.stringify(options)],
    // stdin is held open for the child's life: it ends when this process does, however it ends.
    { stdio: ["pipe", "pipe", "pipe"] },
  )
  let stderr = ""
  child.stderr!.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-8000)
  })
  let stopping = false
  const exited = new Promise<void>((resolve) =>
    child.once("exit", (code, signal) => {
      // An exit nobody asked for is the test's failure: show why.
      if (!stopping) console.error(`upload gateway exited (${code ?? signal}):\n${stderr}`)
      resolve()
    }),
  )
  const ready = await new Promise<{ url: string; account: string; token: string }>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! })
    lines.once("line", (line) => resolve(JSON.parse(line)))
    child.once("exit", (code) => reject(new Error(`gateway exited (${code}) before ready:\n${stderr}`)))
  })
  return {
    ...ready,
    pid: child.pid!,
    stop: async () => {
      stopping = true
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM")
      await exited
    },
  }
}

/** Resident memory of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`). */
export const rssOf = async (pid: number): Promise<number> => {
  const status = await readFile(`/proc/${pid}/status`, "utf8")
  const kb = /^VmRSS:\s+(\d+) kB$/m.exec(status)
  if (!kb) throw new Error(`no VmRSS for ${pid}`)
  return Number(kb[1]) * 1024
}

/**
 * A body of `total` bytes made on the fly from a 1 MiB random pool, each piece stamped with its
 * index so the content never repeats; the same `total` always gives the same bytes.
 */
export function* generated(total: number, pool: Buffer, piece = 1024 * 1024): Generator<Buffer> {
  for (let sent = 0, i = 0; sent < total; sent += piece, i++) {
    const n = Math.min(piece, total - sent)
    const out = Buffer.from(pool.subarray(0, n))
    if (n >= 8) out.writeBigUInt64BE(BigInt(i), 0)
    yield out
  }
}

/** SHA-256 (hex) of a generated body. */
export const sha256Of = (pieces: Iterable<Uint8Array>): string => {
  const hash = createHash("sha256")
  for (const p of pieces) hash.update(p)
  return hash.digest("hex")
}

/** Sends `pieces` as the body of `method url` with `headers`, respecting backpressure. */
export const sendBody = (
  url: string,
  method: string,
  headers: Record<string, string>,
  pieces: Iterable<Uint8Array>,
): Promise<{ status: number; body: string }> =>
  new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers }, (res) => {
      let body = ""
      res.on("data", (d: Buffer) => {
        body += d.toString()
      })
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }))
      res.on("error", reject)
    })
    req.on("error", reject)
    const it = pieces[Symbol.iterator]()
    const pump = () => {
      for (;;) {
        const next = it.next()
        if (next.done) return void req.end()
        if (!req.write(next.value)) return void req.once("drain", pump)
      }
    }
    pump()
  })
