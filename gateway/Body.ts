/**
 * Request bodies. uWS hands body bytes to `res.onData`, which must be attached before the uWS
 * handler returns; `BodySource` buffers them until the handler's fiber pulls. While more than
 * `HIGH_WATER` bytes wait unread the client is paused (`res.pause()`, TCP backpressure) and resumed
 * once the reader has taken them, so a slow consumer of a 5 GB upload holds at most about
 * `HIGH_WATER` plus one uWS read in memory. The byte limit is enforced as bytes arrive.
 */

import type { HttpResponse } from "uWebSockets.js"
import { Chunk, Effect, Option, Stream } from "effect"
import { ApiError } from "../schema/Errors.ts"
import type { Exchange } from "./Response.ts"

/** Buffered unread bytes above which the client is paused. */
export const HIGH_WATER = 1024 * 1024

/** The default body limit of JSON routes: 1 MiB. */
export const JSON_LIMIT = 1024 * 1024

/** The body of one request, fed by uWS and read once by the handler's fiber. */
export class BodySource {
  private chunks: Array<Uint8Array> = []
  private buffered = 0
  private received = 0
  private done = false
  private paused = false
  private error: ApiError | undefined
  private wake: (() => void) | undefined

  constructor(
    private readonly res: HttpResponse,
    private readonly exchange: Exchange,
    private readonly limit: number,
  ) {
    // Attached synchronously by the server, while uWS's handler runs.
    res.onData((ab, isLast) => this.onData(ab, isLast))
    exchange.onReply = () => this.discard()
  }

  // The reply has started: what the handler has not read by now is dropped, and a paused client
  // is resumed so it can finish sending and the keep-alive connection stays usable.
  private discard(): void {
    // Called while the reply is being written (already marked ended, not yet sent): res is valid.
    if (this.paused && !this.exchange.aborted) {
      this.paused = false
      this.res.resume()
    }
    if (this.done || this.error) return
    this.error = ApiError.invalidRequest("body: not read before the reply")
    this.chunks = []
    this.buffered = 0
    this.notify()
  }

  private onData(ab: ArrayBuffer, isLast: boolean): void {
    if (this.done || this.error) return
    this.received += ab.byteLength
    if (this.received > this.limit) {
      this.error = ApiError.payloadTooLarge(this.limit)
      this.chunks = []
      this.buffered = 0
    } else {
      // uWS reuses (neuters) the ArrayBuffer once this callback returns: copy it.
      if (ab.byteLength > 0) {
        this.chunks.push(new Uint8Array(ab.slice(0)))
        this.buffered += ab.byteLength
      }
      if (isLast) this.done = true
      else if (this.buffered >= HIGH_WATER && !this.paused && this.exchange.open) {
        this.paused = true
        this.res.pause()
      }
    }
    this.notify()
  }

  private notify(): void {
    const wake = this.wake
    this.wake = undefined
    wake?.()
  }

  private take(): Option.Option<Chunk.Chunk<Uint8Array>> {
    if (this.chunks.length === 0) return Option.none()
    const out = Chunk.unsafeFromArray(this.chunks)
    this.chunks = []
    this.buffered = 0
    if (this.paused && this.exchange.open) {
      this.paused = false
      this.res.resume()
    }
    return Option.some(out)
  }

  // Runs `attempt` now and again each time bytes arrive, until it has answered (it says so).
  private waitFor<A, E>(
    attempt: (resume: (effect: Effect.Effect<A, E>) => void) => boolean,
  ): Effect.Effect<A, E> {
    return Effect.async((resume) => {
      if (attempt(resume)) return
      const retry = () => {
        if (!attempt(resume)) this.wake = retry
      }
      this.wake = retry
      return Effect.sync(() => {
        this.wake = undefined
      })
    })
  }

  /** Takes what has arrived, waiting for more; fails with `None` at the end of the body. */
  private readonly pull: Effect.Effect<Chunk.Chunk<Uint8Array>, Option.Option<ApiError>> = this.waitFor(
    (resume) => {
      if (this.error) resume(Effect.fail(Option.some(this.error)))
      else {
        const chunk = this.take()
        if (Option.isSome(chunk)) resume(Effect.succeed(chunk.value))
        else if (this.done) resume(Effect.fail(Option.none()))
        else return false
      }
      return true
    },
  )

  /** The body as a stream of byte chunks, with backpressure to the client; fails past the limit. */
  readonly stream: Stream.Stream<Uint8Array, ApiError> = Stream.repeatEffectChunkOption(this.pull)

  /**
   * The whole body in one buffer (for JSON routes, whose limit keeps it small). Gathered by one
   * wait rather than through `stream`: a JSON body comes with nearly every write request.
   */
  readonly readAll: Effect.Effect<Uint8Array, ApiError> = Effect.suspend(() => {
    const parts: Array<Uint8Array> = []
    return this.waitFor<Uint8Array, ApiError>((resume) => {
      if (this.error) {
        resume(Effect.fail(this.error))
        return true
      }
      const chunk = this.take()
      if (Option.isSome(chunk)) for (const part of chunk.value) parts.push(part)
      if (!this.done) return false
      resume(
        Effect.succeed(parts.length === 1 ? (parts[0] as Uint8Array) : new Uint8Array(Buffer.concat(parts))),
      )
      return true
    })
  })
}

/** Whether a `content-type` header names JSON (`application/json`, parameters allowed). */
export const isJson = (contentType: string | undefined): boolean => {
  if (contentType === undefined) return false
  const semi = contentType.indexOf(";")
  const mime = (semi === -1 ? contentType : contentType.slice(0, semi)).trim().toLowerCase()
  return mime === "application/json"
}
