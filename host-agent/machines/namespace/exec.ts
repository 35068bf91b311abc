/**
 * Runs host tools (ip, tc, nft, crun, losetup, mkfs…) through a small helper process
 * (`exec-helper.mjs`), started on first use and again if it ever ends. A tool started from this
 * process would be forked from it, and fork copies the page tables of everything it holds: with
 * the host agent's few hundred MiB that is 10–20 ms a tool, and a machine's start and end each run
 * about a dozen. Forked from the helper (~40 MiB) it is ~2 ms.
 */
import { type ChildProcess, fork } from "node:child_process"
import { fileURLToPath } from "node:url"

interface Answer {
  readonly id: number
  readonly code?: number | null
  readonly stdout?: string
  readonly stderr?: string
  readonly error?: string
}

const helperPath = fileURLToPath(new URL("./exec-helper.mjs", import.meta.url))

let helper: ChildProcess | undefined
let nextId = 0
const pending = new Map<number, { readonly ok: (a: Answer) => void; readonly fail: (e: Error) => void }>()

const started = (): ChildProcess => {
  if (helper !== undefined) return helper
  // Plain node: the parent's loader (tsx) would only make it bigger.
  const child = fork(helperPath, [], { execArgv: [], stdio: ["ignore", "ignore", "inherit", "ipc"] })
  child.on("message", (raw) => {
    const answer = raw as Answer
    const waiter = pending.get(answer.id)
    pending.delete(answer.id)
    // Idle, the helper keeps no one alive: a process ends when its own work is done.
    if (pending.size === 0) child.channel?.unref()
    waiter?.ok(answer)
  })
  const gone = (why: string) => {
    if (helper !== child) return
    helper = undefined
    for (const waiter of pending.values()) waiter.fail(new Error(`the tool runner ${why}`))
    pending.clear()
  }
  child.on("exit", (code, signal) => gone(`exited (${signal ?? code})`))
  child.on("error", (e) => gone(`failed: ${e.message}`))
  child.unref()
  child.channel?.unref()
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
    const id = nextId++
    pending.set(id, { ok, fail })
    child.channel?.ref()
    child.send({ id, ...request }, (e) => {
      if (e === null || e === undefined || !pending.delete(id)) return
      if (pending.size === 0) child.channel?.unref()
      fail(new Error(`the tool runner: ${e.message}`))
    })
  })

/** Runs a host tool and collects its output; fails with the tool's stderr when it exits non-zero. */
export const run = (cmd: string, args: ReadonlyArray<string>, options: { readonly input?: string } = {}) =>
  call({ cmd, args, input: options.input ?? "" }).then((a) => {
    if (a.error !== undefined) throw new Error(`${cmd}: ${a.error}`)
    if (a.code === 0) return a.stdout ?? ""
    throw new Error(`${cmd} ${args.join(" ")} exited ${a.code}: ${(a.stderr ?? "").trim()}`)
  })

/**
 * Runs a tool with exactly `env`, its output appended to the file `log`; answers its exit code
 * (null when it could not start or was killed).
 */
export const launch = (
  cmd: string,
  args: ReadonlyArray<string>,
  options: { readonly env: Readonly<Record<string, string>>; readonly log: string },
): Promise<number | null> =>
  call({ cmd, args, env: options.env, log: options.log }).then((a) =>
    a.error === undefined ? (a.code ?? null) : null,
  )
