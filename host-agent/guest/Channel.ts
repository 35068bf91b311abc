/**
 * Small helpers over a session's raw exec channels: shell quoting, running a short script whose
 * output is collected whole, and streaming what a channel sends.
 */
import type { Readable } from "node:stream"
import { Effect, Stream } from "effect"
import type { ClientChannel } from "ssh2"
import { endingAtOnce } from "../../core/Iterables.ts"
import { type GuestSession, GuestUnavailable } from "./GuestSession.ts"

/** `s` as one single-quoted shell word. */
export const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`

export type { ChannelExit } from "./GuestSession.ts"

/** What a collected script produced. */
export interface Collected {
  readonly code: number
  readonly stdout: Buffer
  readonly stderr: string
}

/** The most of a collected script's stdout held: its answers are a line or a few (`collect`). */
export const COLLECT_STDOUT_MAX_BYTES = 1024 * 1024
/** The end of a channel's stderr kept (`stderrTail`; a failure is quoted by its last lines). */
const STDERR_KEPT_BYTES = 16 * 1024

/**
 * What `ch` writes on stderr, its last 16 KiB only, read as text when asked: the guest is the
 * tenant's, and a program there that floods its stderr makes the host agent hold no more.
 */
export const stderrTail = (ch: ClientChannel): (() => string) => {
  let kept = Buffer.alloc(0)
  ch.stderr.on("data", (b: Buffer) => {
    const both = Buffer.concat([kept, b])
    kept = both.subarray(Math.max(0, both.length - STDERR_KEPT_BYTES))
  })
  return () => kept.toString("utf8")
}

/**
 * Runs `script` with `input` on its stdin and collects its whole output; for short answers only.
 * The guest is the tenant's (any program the script runs may be replaced): a stdout past
 * `COLLECT_STDOUT_MAX_BYTES` fails the call at once and closes the channel, without waiting for
 * the program's end, and only the end of stderr is kept, so no machine makes the host agent hold
 * more than that.
 */
export const collect = (
  guest: GuestSession,
  script: string,
  input: Uint8Array = new Uint8Array(0),
): Effect.Effect<Collected, GuestUnavailable> =>
  Effect.flatMap(guest.channel(script), ({ channel: ch, exit }) =>
    Effect.tryPromise({
      try: async () => {
        const out: Array<Buffer> = []
        let outBytes = 0
        const tooMuch = new Promise<never>((_, fail) => {
          ch.on("data", (b: Buffer) => {
            outBytes += b.length
            if (outBytes <= COLLECT_STDOUT_MAX_BYTES) return void out.push(b)
            ch.close()
            fail(
              new Error(`the machine answered more than ${COLLECT_STDOUT_MAX_BYTES} bytes to a short script`),
            )
          })
        })
        tooMuch.catch(() => undefined)
        const stderr = stderrTail(ch)
        ch.end(input)
        const { code } = await Promise.race([exit, tooMuch])
        return { code, stdout: Buffer.concat(out), stderr: stderr() }
      },
      catch: (e) => new GuestUnavailable({ detail: e instanceof Error ? e.message : String(e) }),
    }).pipe(Effect.onInterrupt(() => Effect.sync(() => ch.close()))),
  )

/**
 * The chunks `source` (a channel, or a stream fed by one) gives, each read when the consumer takes
 * it, so the channel's window holds the guest back. Its end never waits on the guest
 * (`endingAtOnce`): the guest is the tenant's (root in its machine, any program there may be
 * replaced), it decides when its side of a channel ends, and a consumer cut off while it sent
 * nothing waited for it for ever, and with it the run's end and the machine's removal. The read
 * still pending ends with the channel, which its owner closes, or with the connection, which goes
 * with the machine; the iterator's own `return()` then destroys the source.
 */
export const chunksOf = <E>(source: Readable, onError: (cause: unknown) => E): Stream.Stream<Uint8Array, E> =>
  Stream.fromAsyncIterable(
    endingAtOnce(source as AsyncIterable<Uint8Array>, (inner) => void inner.return?.().catch(() => {})),
    onError,
  )
