/**
 * `hangar shell RUN`: an end-to-end encrypted terminal in a run's machine (spec "Terminal session
 * protocol"), with the codec and key schedule of `core/Terminal.ts`.
 *
 *   1. a fresh ECDH P-256 pair; a `terminal` command with the local size (24x80 when stdout is no
 *      terminal) and the public key, waited for (`?wait=25`) until it ends;
 *   2. the session's keys from the host's public key; a WebSocket to `relay_url?route=…&side=caller`;
 *   3. stdin in raw mode (when a terminal), every keystroke an input frame (Ctrl-C included: it
 *      interrupts the remote program, not this one), a resize frame on each SIGWINCH, output
 *      frames to stdout, until the exit status frame: the CLI exits with it.
 *
 * Ends otherwise: the command failed (its `error`), the relay refused the upgrade (its status and
 * text), the socket closed without an exit status (its code and reason), a frame that does not
 * open in sequence (closed 1008): each printed, exit 4; SIGINT, SIGTERM or SIGHUP to the CLI: the
 * session is closed, exit 128 + the signal's number. On every path the local terminal is restored
 * first (raw mode off, listeners removed, stdin paused); a process `exit` hook turns raw mode off
 * even if something escaped.
 *
 * Decisions:
 * - A stdin that is no terminal and ends sends Ctrl-D (the remote terminal's end of input), so
 *   `hangar shell RUN < script` ends when the shell reads to its end.
 * - `--json`: the shell's output is not printed; stdout holds only `{exit_status}` after the session.
 * - A close without an exit status frame exits 4 whatever its code (a 1000 "the run ended" has no
 *   status of the shell to give).
 * - Silence: the CLI pings the relay every 20 s; three pings with nothing heard end the session
 *   (a relay or network gone without a close would otherwise leave the terminal waiting forever).
 */
import WebSocket from "ws"
import {
  FRAME_DATA_MAX_BYTES,
  FRAME_MAX_BYTES,
  Kind,
  newKeyPair,
  open,
  seal,
  sessionKeys,
} from "../../../core/Terminal.ts"
import type { Api } from "../Api.ts"
import type { Command } from "../Command.ts"
import { ExitWith } from "../Failures.ts"
import { json, note } from "../Print.ts"

/** The signals that end the CLI's session, with their numbers (exit status 128 + n). */
const SIGNALS = { SIGHUP: 1, SIGINT: 2, SIGTERM: 15 } as const

/** A terminal side's largest value (`schema/Limits.ts` `terminalMaxSide`). */
const SIDE_MAX = 65_535

const ENDED: ReadonlySet<string> = new Set(["succeeded", "failed", "cancelled"])

/** Input waiting in the socket past which stdin stops being read, and below which it reads again. */
const INPUT_HIGH_BYTES = 1024 * 1024
const INPUT_LOW_BYTES = 256 * 1024

const PING_MS = 20_000
const SILENT_PINGS_MAX = 3

/** What a `terminal` command's record holds (the fields read here). */
interface TerminalRecord {
  readonly id: string
  readonly state: string
  readonly error?: string
  readonly result?: {
    readonly relay_url?: unknown
    readonly route?: unknown
    readonly public_key?: unknown
    readonly error?: unknown
  }
}

interface Size {
  readonly rows: number
  readonly cols: number
}

const side = (n: number | undefined, fallback: number) =>
  Number.isInteger(n) && (n as number) > 0 ? Math.min(n as number, SIDE_MAX) : fallback

/** The local terminal's size, or 24x80 when stdout is not a terminal. */
const sizeOf = (): Size =>
  process.stdout.isTTY
    ? { rows: side(process.stdout.rows, 24), cols: side(process.stdout.columns, 80) }
    : { rows: 24, cols: 80 }

const resizeData = (size: Size): Buffer => {
  const data = Buffer.alloc(4)
  data.writeUInt16BE(size.rows, 0)
  data.writeUInt16BE(size.cols, 2)
  return data
}

const bufferOf = (data: WebSocket.RawData): Buffer =>
  Array.isArray(data) ? Buffer.concat(data) : Buffer.isBuffer(data) ? data : Buffer.from(data)

/** What is undone when the command ends, last first; each step runs once even if one throws. */
class Undo {
  private readonly steps: Array<() => void> = []
  add(step: () => void): void {
    this.steps.push(step)
  }
  run(): void {
    for (const step of this.steps.splice(0).reverse()) {
      try {
        step()
      } catch {
        // The next steps still run (a terminal already gone cannot leave raw mode).
      }
    }
  }
}

/** Signal handlers for the whole command: `stopped` rejects with the exit status of the signal. */
const interruptions = (undo: Undo) => {
  const abort = new AbortController()
  let stop: (e: ExitWith) => void = () => undefined
  const stopped = new Promise<never>((_, reject) => {
    stop = reject
  })
  stopped.catch(() => undefined)
  for (const [name, number] of Object.entries(SIGNALS)) {
    const on = () => {
      abort.abort()
      stop(new ExitWith(128 + number))
    }
    process.on(name, on)
    undo.add(() => process.off(name, on))
  }
  /** `work`, unless a signal comes first. */
  const race = <T>(work: Promise<T>): Promise<T> => Promise.race([work, stopped])
  return { signal: abort.signal, stopped, race }
}

/** Where to meet the host and the session's keys, once the `terminal` command ended. */
const openTerminal = async (
  api: Api,
  run: string,
  quiet: boolean,
  { signal, race }: ReturnType<typeof interruptions>,
) => {
  const { ecdh, publicKey } = newKeyPair()
  const size = sizeOf()
  const path = `/v1/runs/${encodeURIComponent(run)}/commands`
  let record = await race(
    api.call<TerminalRecord>(
      "POST",
      path,
      {
        kind: "terminal",
        arguments: { rows: size.rows, cols: size.cols, public_key: publicKey.toString("base64url") },
      },
      { signal },
    ),
  )
  for (let waits = 0; !ENDED.has(record.state); waits++) {
    if (waits === 1 && !quiet) note("hangar shell: waiting for the run's machine…")
    record = await race(
      api.call<TerminalRecord>("GET", `${path}/${encodeURIComponent(record.id)}`, undefined, {
        query: { wait: 25 },
        signal,
      }),
    )
  }
  if (record.state !== "succeeded")
    throw new Error(record.error ?? `the terminal command was ${record.state}`)
  const result = record.result ?? {}
  if (typeof result.error === "string") throw new Error(result.error)
  const { relay_url, route, public_key } = result
  if (typeof relay_url !== "string" || typeof route !== "string" || typeof public_key !== "string")
    throw new Error("the terminal command answered no relay, route or host key")
  const hostPublicKey = Buffer.from(public_key, "base64url")
  let keys: ReturnType<typeof sessionKeys>
  try {
    keys = sessionKeys(ecdh, hostPublicKey, publicKey, hostPublicKey)
  } catch {
    throw new Error("the host's public key is not a P-256 point")
  }
  const url = new URL(relay_url)
  url.searchParams.set("route", route)
  url.searchParams.set("side", "caller")
  return { url, relay: relay_url, size, ...keys }
}

/** The session over the relay; answers the remote exit status. */
const session = (
  terminal: Awaited<ReturnType<typeof openTerminal>>,
  showOutput: boolean,
  undo: Undo,
  stopped: Promise<never>,
): Promise<number> =>
  new Promise<number>((resolve, reject) => {
    const stdin = process.stdin
    const stdout = process.stdout
    const ws = new WebSocket(terminal.url, { perMessageDeflate: false, maxPayload: FRAME_MAX_BYTES })
    let opened = false
    let settled = false
    let exitStatus: number | undefined
    let sent = 0n
    let received = 0n
    let sentSize = terminal.size
    let inputHeld = false

    const end = (settle: () => void) => {
      if (settled) return
      settled = true
      settle()
    }
    const fail = (e: unknown) => end(() => reject(e))
    const closeSocket = (code: number, reason: string) => {
      if (ws.readyState === WebSocket.OPEN) ws.close(code, reason)
      else if (ws.readyState === WebSocket.CONNECTING) ws.terminate()
    }
    undo.add(() => closeSocket(1001, "the caller left"))
    // An event handler that throws ends the session rather than the process (raw mode on).
    const guarded =
      <A extends Array<unknown>>(f: (...args: A) => void) =>
      (...args: A) => {
        try {
          f(...args)
        } catch (e) {
          closeSocket(1011, "the caller failed")
          fail(e)
        }
      }

    stopped.catch((e: unknown) => {
      closeSocket(1001, "the caller stopped")
      fail(e)
    })

    const send = (kind: number, data: Buffer) => {
      if (ws.readyState !== WebSocket.OPEN) return
      ws.send(seal(terminal.callerToHost, kind, sent++, data), () => {
        if (inputHeld && !settled && ws.bufferedAmount < INPUT_LOW_BYTES) {
          inputHeld = false
          stdin.resume()
        }
      })
      if (!inputHeld && ws.bufferedAmount > INPUT_HIGH_BYTES) {
        inputHeld = true
        stdin.pause()
      }
    }
    const breach = (problem: string) => {
      closeSocket(1008, problem.slice(0, 120))
      fail(new Error(`the session broke: ${problem}`))
    }

    const onInput = guarded((chunk: Buffer | string) => {
      const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk
      for (let at = 0; at < bytes.length; at += FRAME_DATA_MAX_BYTES)
        send(Kind.input, bytes.subarray(at, at + FRAME_DATA_MAX_BYTES))
    })
    const onInputEnd = guarded(() => send(Kind.input, Buffer.from([4])))
    const onResize = guarded(() => {
      const size = sizeOf()
      if (size.rows === sentSize.rows && size.cols === sentSize.cols) return
      sentSize = size
      send(Kind.resize, resizeData(size))
    })
    const onStdoutError = (e: Error) => {
      closeSocket(1001, "the caller's terminal is gone")
      fail(new Error(`stdout: ${e.message}`))
    }
    stdout.on("error", onStdoutError)
    undo.add(() => stdout.off("error", onStdoutError))

    ws.on(
      "open",
      guarded(() => {
        opened = true
        if (stdin.isTTY) {
          const rawOff = () => {
            if (stdin.isRaw) stdin.setRawMode(false)
          }
          // The last resort: an exit that skipped the undo still leaves the terminal cooked.
          process.on("exit", rawOff)
          undo.add(() => process.off("exit", rawOff))
          stdin.setRawMode(true)
          undo.add(rawOff)
        }
        stdin.on("data", onInput)
        stdin.on("end", onInputEnd)
        undo.add(() => {
          stdin.off("data", onInput)
          stdin.off("end", onInputEnd)
          stdin.pause()
        })
        stdin.resume()
        if (stdout.isTTY) {
          stdout.on("resize", onResize)
          undo.add(() => stdout.off("resize", onResize))
          onResize()
        }
        let silent = 0
        const heard = () => {
          silent = 0
        }
        ws.on("pong", heard)
        ws.on("ping", heard)
        ws.on("message", heard)
        const pinger = setInterval(
          guarded(() => {
            if (++silent >= SILENT_PINGS_MAX) {
              ws.terminate()
              return fail(new Error("the relay stopped answering"))
            }
            ws.ping()
          }),
          PING_MS,
        )
        undo.add(() => clearInterval(pinger))
      }),
    )

    ws.on(
      "message",
      guarded((data: WebSocket.RawData, isBinary: boolean) => {
        if (settled) return
        if (!isBinary) return breach("a text message")
        const frame = open(terminal.hostToCaller, bufferOf(data), received)
        if ("problem" in frame) return breach(frame.problem)
        received++
        if (exitStatus !== undefined) return breach("a frame after the exit status")
        if (frame.kind === Kind.output) {
          if (showOutput && !stdout.write(frame.data)) {
            ws.pause()
            stdout.once("drain", () => ws.resume())
          }
        } else if (frame.kind === Kind.exit) {
          if (frame.data.length !== 4) return breach("an exit status frame that is not 4 bytes")
          exitStatus = frame.data.readInt32BE(0)
          // The host closes right after its exit status; if that close gets lost, end anyway.
          const status = exitStatus
          const late = setTimeout(() => {
            closeSocket(1000, "the shell exited")
            end(() => resolve(status))
          }, 2_000)
          undo.add(() => clearTimeout(late))
        } else return breach(`a frame of kind ${frame.kind} from the host`)
      }),
    )

    ws.on("unexpected-response", (request, response) => {
      let body = ""
      response.setEncoding("utf8")
      response.on("data", (chunk: string) => {
        if (body.length < 1000) body += chunk
      })
      const refused = () => {
        request.destroy()
        fail(
          new Error(
            `the relay refused the terminal: ${response.statusCode ?? "?"}${body.trim() === "" ? "" : ` ${body.trim().slice(0, 200)}`}`,
          ),
        )
      }
      response.on("end", refused)
      response.on("error", refused)
    })

    ws.on("error", (e: Error) => {
      if (exitStatus !== undefined) return end(() => resolve(exitStatus as number))
      fail(
        new Error(
          opened
            ? `the connection to the relay broke: ${e.message}`
            : `cannot reach the relay at ${terminal.relay}: ${e.message}`,
        ),
      )
    })

    ws.on("close", (code: number, reason: Buffer) => {
      if (exitStatus !== undefined) return end(() => resolve(exitStatus as number))
      const why = reason.toString("utf8")
      fail(new Error(`the terminal closed without an exit status (${code}${why === "" ? "" : `: ${why}`})`))
    })
  })

export const shell: Command = {
  positionals: [1, 1],
  run: async ({ api, out, positionals }) => {
    const run = positionals[0] as string
    const undo = new Undo()
    let status: number
    try {
      const interrupts = interruptions(undo)
      const terminal = await openTerminal(api, run, out.json, interrupts)
      status = await session(terminal, !out.json, undo, interrupts.stopped)
    } finally {
      undo.run()
    }
    if (out.json) json({ exit_status: status })
    if (status !== 0) throw new ExitWith(status)
  },
}
