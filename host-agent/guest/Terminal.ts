/**
 * The guest side of the `terminal` command kind: a login shell as root in `/workspace` with the
 * run's variables, on a PTY channel of the session's connection. The relay and the terminal's
 * end-to-end crypto sit in front of this object: it takes input bytes and resizes, gives the
 * shell's output as a stream, and the shell's exit status once it ends.
 *
 * The variables go through a file readable only by root (written on an exec channel, read and
 * removed by the shell's first command), since sshd takes no environment from us and a command
 * line could not hold 64 variables of 64 KiB.
 */
import type { Scope } from "effect"
import { Deferred, Effect, type Stream } from "effect"
import { chunksOf, collect, quote } from "./Channel.ts"
import { type GuestSession, GuestUnavailable, InvalidArguments } from "./GuestSession.ts"

/** What the terminal starts with. */
export interface TerminalArgs {
  readonly rows: number
  readonly cols: number
  /** The run's variables (and the command's own). */
  readonly env?: Readonly<Record<string, string>>
}

/** A running terminal session. */
export interface Terminal {
  /** Sends input bytes to the shell. */
  readonly write: (bytes: Uint8Array) => Effect.Effect<void>
  /** Changes the terminal's size (the shell gets SIGWINCH). */
  readonly resize: (rows: number, cols: number) => Effect.Effect<void, InvalidArguments>
  /** The shell's output (stdout and stderr, as the terminal shows them); read it once. */
  readonly output: Stream.Stream<Uint8Array, GuestUnavailable>
  /** The shell's exit status (128 + the signal number when a signal ended it). */
  readonly exit: Deferred.Deferred<number>
  /** Ends the session (the shell gets SIGHUP); also done when the scope closes. */
  readonly close: Effect.Effect<void>
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/
const SIDE_MAX = 65535 // resize frames carry 16-bit sides

const checkSize = (rows: number, cols: number) => {
  for (const [field, v] of [
    ["rows", rows],
    ["cols", cols],
  ] as const) {
    if (!Number.isInteger(v) || v < 1 || v > SIDE_MAX)
      return new InvalidArguments({ field, detail: `must be an integer from 1 to ${SIDE_MAX}` })
  }
  return undefined
}

/** Opens the terminal; it is closed when the scope closes. */
export const open = (
  guest: GuestSession,
  args: TerminalArgs,
): Effect.Effect<Terminal, GuestUnavailable | InvalidArguments, Scope.Scope> =>
  Effect.gen(function* () {
    const bad = checkSize(args.rows, args.cols)
    if (bad) return yield* bad
    const env = Object.entries(args.env ?? {})
    for (const [k, v] of env) {
      if (!ENV_NAME.test(k))
        return yield* new InvalidArguments({ field: `env.${k}`, detail: "not a variable name" })
      if (v.includes("\0")) return yield* new InvalidArguments({ field: `env.${k}`, detail: "contains NUL" })
    }
    let prelude = ""
    if (env.length > 0) {
      const stored = yield* collect(
        guest,
        `umask 077; f=$(mktemp) && cat > "$f" && echo "$f"`,
        Buffer.from(env.map(([k, v]) => `${k}=${v}\0`).join(""), "utf8"),
      )
      const file = stored.stdout.toString("utf8").trim()
      if (stored.code !== 0 || !file)
        return yield* new GuestUnavailable({ detail: `terminal variables: ${stored.stderr.slice(-500)}` })
      prelude = `f=${quote(file)}; while IFS= read -r -d '' kv; do export "$kv"; done < "$f"; rm -f -- "$f"; unset f kv; `
    }
    const { channel: ch, exit: ended } = yield* Effect.acquireRelease(
      guest.channel(`${prelude}cd /workspace && exec -l /bin/bash`, {
        pty: { rows: args.rows, cols: args.cols, height: 0, width: 0, term: "xterm-256color" },
      }),
      (c) => Effect.sync(() => c.channel.close()),
    )
    const exit = yield* Deferred.make<number>()
    void ended.then((x) => Effect.runFork(Deferred.succeed(exit, x.code)))
    return {
      write: (bytes) =>
        Effect.async<void>((resume) => {
          if (!ch.writable || !ch.write(bytes)) {
            if (!ch.writable) return resume(Effect.void)
            let resumed = false
            const done = () => {
              if (resumed) return
              resumed = true
              resume(Effect.void)
            }
            ch.once("drain", done)
            void ended.then(done)
            return
          }
          resume(Effect.void)
        }),
      resize: (rows, cols) => {
        const invalid = checkSize(rows, cols)
        return invalid ? Effect.fail(invalid) : Effect.sync(() => ch.setWindow(rows, cols, 0, 0))
      },
      output: chunksOf(ch, (e) => new GuestUnavailable({ detail: `terminal output: ${String(e)}` })),
      exit,
      close: Effect.sync(() => ch.close()),
    } satisfies Terminal
  })
