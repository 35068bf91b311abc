/**
 * Runs host tools (ip, tc, nft, crun, losetup, mkfs…) through a small helper process
 * (`exec-helper.py`), started on first use and again if it ever ends. A tool started from this
 * process would be forked from it, and fork copies the page tables of everything it holds: with
 * the host agent's few hundred MiB that is 10–20 ms a tool, and a machine's start and end each run
 * about a dozen. The helper starts each with posix_spawn, which copies no page table: 2.3 ms of CPU
 * a `true` in all (the helper's and the tool's), against 8.3 ms through the perl helper it
 * replaced, whose fork copied its page tables and took copy-on-write faults on both sides.
 *
 * The helper speaks frames both ways (`exec-helper.py` has the layout): a line of the field count
 * and each field's length in bytes, then the fields.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { setPriority } from "node:os"
import { fileURLToPath } from "node:url"
import { readText, reniceAll } from "../HostFiles.ts"

interface Answer {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
  readonly error?: string
}

/** The helper program (tests start it themselves to look at it alone), and what runs it. */
export const helperPath = fileURLToPath(new URL("./exec-helper.py", import.meta.url))
export const helperInterpreter = ["/usr/bin/python3", "-I", "-S"] as const

let helper: ChildProcess | undefined
let nextId = 0
/**
 * The nice value of the helper, so of the tools it starts from then on (`setToolNice`); none: the
 * nice of the thread that started it.
 */
let toolNice: number | undefined

const renice = (child: ChildProcess) => {
  try {
    if (child.pid !== undefined && toolNice !== undefined) setPriority(child.pid, toolNice)
  } catch {
    // it ended: the next one is started at `toolNice`
  }
}

/** The tool runner's process id, while it runs. */
export const toolRunnerPid = (): number | undefined => helper?.pid

/**
 * Runs the tools at `nice`: those started from now on (they inherit the helper's), and those
 * running now (a run may have come to wait for them). The machine thread sets it nicer while all
 * its work is in the background. A tool's own children keep theirs.
 */
export const setToolNice = (nice: number): void => {
  if (nice === toolNice) return
  toolNice = nice
  const pid = helper?.pid
  if (helper === undefined || pid === undefined) return
  renice(helper)
  for (const tool of (readText(`/proc/${pid}/task/${pid}/children`) ?? "").split(" "))
    if (tool !== "") reniceAll(Number(tool), nice)
}
const pending = new Map<string, { readonly ok: (a: Answer) => void; readonly fail: (e: Error) => void }>()

/** One frame of `fields`. */
export const frame = (fields: ReadonlyArray<string | Buffer>): Buffer => {
  const bytes = fields.map((f) => (typeof f === "string" ? Buffer.from(f, "utf8") : f))
  return Buffer.concat([
    Buffer.from(`${bytes.length} ${bytes.map((b) => b.length).join(" ")}\n`, "latin1"),
    ...bytes,
  ])
}

/** Takes whole frames off the front of `buffer`; answers them and what is left. */
export const frames = (buffer: Buffer): { readonly whole: Array<Array<Buffer>>; readonly rest: Buffer } => {
  const whole: Array<Array<Buffer>> = []
  let at = 0
  for (;;) {
    const eol = buffer.indexOf(10, at)
    if (eol < 0) break
    const [, ...lengths] = buffer.toString("latin1", at, eol).split(" ").map(Number)
    let size = 0
    for (const l of lengths) size += l
    if (buffer.length < eol + 1 + size) break
    let field = eol + 1
    whole.push(
      lengths.map((l) => {
        const b = buffer.subarray(field, field + l)
        field += l
        return b
      }),
    )
    at = field
  }
  return { whole, rest: at === 0 ? buffer : buffer.subarray(at) }
}

/** Idle, the helper keeps no one alive: a process ends when its own work is done. */
const hold = (child: ChildProcess, held: boolean) => {
  const out = child.stdout as (NodeJS.ReadableStream & { ref?: () => void; unref?: () => void }) | null
  if (held) out?.ref?.()
  else out?.unref?.()
}

const started = (): ChildProcess => {
  if (helper !== undefined) return helper
  const [interpreter, ...flags] = helperInterpreter
  const child = spawn(interpreter, [...flags, helperPath], { stdio: ["pipe", "pipe", "inherit"] })
  // Set whatever the thread starting it runs at (a thread's nice is its own, and a fork's).
  renice(child)
  let buffer = Buffer.alloc(0)
  child.stdout?.on("data", (chunk: Buffer) => {
    const { whole, rest } = frames(buffer.length === 0 ? chunk : Buffer.concat([buffer, chunk]))
    buffer = rest.length === 0 ? Buffer.alloc(0) : Buffer.from(rest)
    for (const [id, kind, ...fields] of whole) {
      const key = id?.toString("latin1") ?? ""
      const waiter = pending.get(key)
      pending.delete(key)
      if (pending.size === 0) hold(child, false)
      if (kind?.toString("latin1") === "error")
        waiter?.ok({ code: null, stdout: "", stderr: "", error: fields[0]?.toString("utf8") ?? "" })
      else {
        const code = fields[0]?.toString("latin1") ?? ""
        waiter?.ok({
          code: code === "" ? null : Number(code),
          stdout: fields[1]?.toString("utf8") ?? "",
          stderr: fields[2]?.toString("utf8") ?? "",
        })
      }
    }
  })
  const gone = (why: string) => {
    if (helper !== child) return
    helper = undefined
    for (const waiter of pending.values()) waiter.fail(new Error(`the tool runner ${why}`))
    pending.clear()
  }
  child.on("exit", (code, signal) => gone(`exited (${signal ?? code})`))
  child.on("error", (e) => gone(`failed: ${e.message}`))
  child.stdin?.on("error", () => undefined) // its end is reported by `exit`
  child.unref()
  ;(child.stdin as { unref?: () => void } | null)?.unref?.()
  hold(child, false)
  helper = child
  return child
}

const call = (request: {
  readonly cmd: string
  readonly args: ReadonlyArray<string>
  readonly input?: string
  readonly env?: Readonly<Record<string, string>>
  readonly log?: string
}): Promise<Answer> =>
  new Promise<Answer>((ok, fail) => {
    const child = started()
    const id = String(nextId++)
    pending.set(id, { ok, fail })
    hold(child, true)
    const env =
      request.env === undefined
        ? ""
        : `=${Object.entries(request.env)
            .map(([k, v]) => `${k}=${v}`)
            .join("\0")}`
    child.stdin?.write(frame([id, request.log ?? "", request.input ?? "", env, request.cmd, ...request.args]))
  })

/** A tool's output, or its failure named by `cmd` and `args` with its stderr. */
const outcome = (cmd: string, args: ReadonlyArray<string>) => (a: Answer) => {
  if (a.error !== undefined) throw new Error(`${cmd}: ${a.error}`)
  if (a.code === 0) return a.stdout
  throw new Error(`${cmd} ${args.join(" ")} exited ${a.code}: ${a.stderr.trim()}`)
}

/** Runs a host tool and collects its output; fails with the tool's stderr when it exits non-zero. */
export const run = (cmd: string, args: ReadonlyArray<string>, options: { readonly input?: string } = {}) =>
  call({ cmd, args, input: options.input ?? "" }).then(outcome(cmd, args))

/**
 * Runs `script` as one nft transaction, as `nft -f -` does and failing as it would, but with no
 * program started: the helper runs it through libnftables (0.2–0.9 ms, against ~11 ms of CPU for
 * an `nft`).
 */
export const nft = (script: string): Promise<void> =>
  call({ cmd: ":nft", args: [], input: script })
    .then(outcome("nft", ["-f", "-"]))
    .then(() => undefined)

/**
 * Makes (`up`: netns, pid or "" for a netns already made, host interface, host address, guest
 * address, bytes a second or "" for no shaping) or removes (`down`: host interface, netns) a
 * machine's network in the helper, over rtnetlink, as the `ip` and `tc` runs in `Net.ts` did:
 * with no program started (four at a machine's start, one at its end: ~35 ms of host CPU a
 * machine in all, measured).
 */
export const network = (what: "up" | "down", args: ReadonlyArray<string>): Promise<void> =>
  call({ cmd: `:net-${what}`, args })
    .then(outcome(`net-${what}`, args))
    .then(() => undefined)

/**
 * Runs a tool with exactly `env`, its output appended to the file `log`; answers its exit code
 * (null when it could not start or was killed). With `sealed`, the tool finds that program (looked
 * up in `env`'s PATH) on its descriptor 3 as a sealed in-memory copy it may run from
 * `/proc/self/fd/3`: crun run so skips copying itself into memory and starting again from the copy
 * (~4.5 ms of every machine's start; the helper keeps one copy while the file is unchanged).
 */
export const launch = (
  cmd: string,
  args: ReadonlyArray<string>,
  options: {
    readonly env: Readonly<Record<string, string>>
    readonly log: string
    readonly sealed?: string
  },
): Promise<number | null> =>
  call({
    ...(options.sealed === undefined
      ? { cmd, args }
      : { cmd: ":sealed", args: [options.sealed, cmd, ...args] }),
    env: options.env,
    log: options.log,
  }).then((a) => (a.error === undefined ? a.code : null))
