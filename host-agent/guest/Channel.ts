/**
 * Small helpers over a session's raw exec channels: shell quoting, and running a short script whose
 * output is collected whole.
 */
import { Effect } from "effect"
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

/** Runs `script` with `input` on its stdin and collects its whole output; for short answers only. */
export const collect = (
  guest: GuestSession,
  script: string,
  input: Uint8Array = new Uint8Array(0),
): Effect.Effect<Collected, GuestUnavailable> =>
  Effect.flatMap(guest.channel(script), ({ channel: ch, exit }) =>
    Effect.tryPromise({
      try: async () => {
        const out: Array<Buffer> = []
        const err: Array<Buffer> = []
        ch.on("data", (b: Buffer) => out.push(b))
        ch.stderr.on("data", (b: Buffer) => err.push(b))
        ch.end(input)
        const { code } = await exit
        return { code, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString("utf8") }
      },
      catch: (e) => new GuestUnavailable({ detail: e instanceof Error ? e.message : String(e) }),
    }).pipe(Effect.onInterrupt(() => Effect.sync(() => ch.close()))),
  )
