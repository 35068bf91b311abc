/**
 * Replies and how they are written to uWS. A handler returns a `Reply` (JSON, bytes, a stream, or
 * nothing); the server writes it. Rules kept here so no route has to remember them:
 *
 * - nothing is written once the client has aborted or the response has ended (`Exchange.open`),
 *   because uWS forbids touching a response after either;
 * - every write happens inside `res.cork`, so status, headers and body leave in one syscall;
 * - streams respect backpressure: with a known length through `tryEnd` + `onWritable` (uWS keeps
 *   nothing it could not send; we resend the rest when writable), otherwise through `write`
 *   (chunked encoding) waiting for `onWritable` whenever uWS reports buffered data. So a slow
 *   reader of a multi-GB download holds about one chunk in memory, never the file.
 */

import type { HttpResponse } from "uWebSockets.js"
import { Effect, Stream } from "effect"
import type { ApiError } from "../schema/Errors.ts"

/** What a handler answers. Build one with `json`, `bytes`, `stream` or `empty`. */
export type Reply =
  | {
      readonly _tag: "Whole"
      readonly status: number
      readonly headers: Readonly<Record<string, string>>
      readonly contentType: string
      readonly body: string | Uint8Array
    }
  | {
      readonly _tag: "Stream"
      readonly status: number
      readonly headers: Readonly<Record<string, string>>
      readonly contentType: string
      /** The exact byte length when known (sent as `content-length`); chunked encoding otherwise. */
      readonly length: number | undefined
      readonly stream: Stream.Stream<Uint8Array, unknown>
    }
  | {
      readonly _tag: "Empty"
      readonly status: number
      readonly headers: Readonly<Record<string, string>>
    }

/** Options shared by every reply. */
export interface ReplyOptions {
  readonly status?: number
  readonly headers?: Readonly<Record<string, string>>
}

/** A JSON reply (`JSON.stringify(value)`), status 200 unless given. */
export const json = (value: unknown, options: ReplyOptions = {}): Reply => ({
  _tag: "Whole",
  status: options.status ?? 200,
  headers: options.headers ?? {},
  contentType: "application/json",
  body: JSON.stringify(value),
})

/** A reply with a body already in memory. */
export const bytes = (
  body: string | Uint8Array,
  options: ReplyOptions & { readonly contentType?: string } = {},
): Reply => ({
  _tag: "Whole",
  status: options.status ?? 200,
  headers: options.headers ?? {},
  contentType: options.contentType ?? "application/octet-stream",
  body,
})

/**
 * A streamed reply, pulled only as fast as the client reads. Give `length` when known (downloads):
 * the stream must then yield exactly that many bytes, or the connection is closed to show the
 * client a truncated body. A stream failing after the first byte also closes the connection (the
 * status has left already); the failure is logged. Provide the stream's services before returning.
 */
export const stream = (
  body: Stream.Stream<Uint8Array, unknown>,
  options: ReplyOptions & { readonly contentType?: string; readonly length?: number } = {},
): Reply => ({
  _tag: "Stream",
  status: options.status ?? 200,
  headers: options.headers ?? {},
  contentType: options.contentType ?? "application/octet-stream",
  length: options.length,
  stream: body,
})

/** A reply without a body (e.g. 204). */
export const empty = (options: ReplyOptions = {}): Reply => ({
  _tag: "Empty",
  status: options.status ?? 204,
  headers: options.headers ?? {},
})

/** The `{error, code}` reply of an `ApiError`, with its table status. */
export const error = (e: ApiError, headers: Readonly<Record<string, string>> = {}): Reply =>
  json(e.body, { status: e.status, headers })

/** The state of one request/response pair, shared by the uWS callbacks and the handler's fiber. */
export class Exchange {
  aborted = false
  ended = false
  status = 0
  bytes = 0
  /** Set by a body source: called when the reply starts, to drop and un-pause an unread body. */
  onReply: (() => void) | undefined
  private writable: ((offset: number) => boolean) | undefined
  private writableHooked = false
  constructor(readonly requestId: string) {}

  /**
   * Calls `handler` when uWS can take more data, until it returns true. uWS.js 20.30 keeps calling
   * the first function given to `res.onWritable`, so it is registered once and dispatches here.
   */
  whenWritable(res: HttpResponse, handler: (offset: number) => boolean): void {
    this.writable = handler
    if (this.writableHooked) return
    this.writableHooked = true
    res.onWritable((offset) => {
      const current = this.writable
      if (!current || !this.open) return true
      const done = current(offset)
      if (done && this.writable === current) this.writable = undefined
      return done
    })
  }
  /** Whether the response may still be written (not aborted by the client, not ended). */
  get open(): boolean {
    return !this.aborted && !this.ended
  }
}

const REASONS: Record<number, string> = {
  200: "OK",
  201: "Created",
  202: "Accepted",
  204: "No Content",
  206: "Partial Content",
  301: "Moved Permanently",
  302: "Found",
  304: "Not Modified",
  400: "Bad Request",
  401: "Unauthorized",
  402: "Payment Required",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Payload Too Large",
  429: "Too Many Requests",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
}

const statusLine = (status: number): string => `${status} ${REASONS[status] ?? "Status"}`

const writeHead = (
  res: HttpResponse,
  exchange: Exchange,
  status: number,
  headers: Record<string, string>,
) => {
  exchange.status = status
  exchange.onReply?.()
  res.writeStatus(statusLine(status))
  res.writeHeader("x-request-id", exchange.requestId)
  for (const key in headers) res.writeHeader(key, headers[key]!)
}

/** Writes a reply held in memory; a no-op when the response is no longer open. */
export const writeWhole = (
  res: HttpResponse,
  exchange: Exchange,
  reply: Exclude<Reply, { _tag: "Stream" }>,
): void => {
  if (!exchange.open) return
  exchange.ended = true
  res.cork(() => {
    writeHead(res, exchange, reply.status, reply.headers)
    if (reply._tag === "Empty") {
      res.endWithoutBody(0)
      return
    }
    res.writeHeader("content-type", reply.contentType)
    exchange.bytes = typeof reply.body === "string" ? Buffer.byteLength(reply.body) : reply.body.byteLength
    res.end(reply.body)
  })
}

/** Closes the connection at once (a stream that failed midway, or shutdown). */
export const abort = (res: HttpResponse, exchange: Exchange): void => {
  if (!exchange.open) return
  exchange.ended = true
  res.close()
}

// One chunk with a known total: tryEnd sends what fits and keeps nothing; on false we wait for
// onWritable and resend from the offset the socket reached.
const writeSized = (res: HttpResponse, exchange: Exchange, chunk: Uint8Array, total: number) =>
  Effect.async<boolean>((resume) => {
    if (!exchange.open) return resume(Effect.succeed(false))
    let base = 0
    let result: [boolean, boolean] = [false, false]
    res.cork(() => {
      base = res.getWriteOffset()
      result = res.tryEnd(chunk, total)
    })
    if (result[1]) exchange.ended = true
    if (result[0] || result[1]) return resume(Effect.succeed(true))
    exchange.whenWritable(res, (offset) => {
      let again: [boolean, boolean] = [false, false]
      res.cork(() => {
        again = res.tryEnd(chunk.subarray(offset - base), total)
      })
      if (again[1]) exchange.ended = true
      if (again[0] || again[1]) resume(Effect.succeed(true))
      return again[0]
    })
  })

// One chunk of unknown total: write buffers what the socket did not take and returns false; we
// then wait for the drain before producing more.
const writeChunked = (res: HttpResponse, exchange: Exchange, chunk: Uint8Array) =>
  Effect.async<boolean>((resume) => {
    if (!exchange.open) return resume(Effect.succeed(false))
    let ok = false
    res.cork(() => {
      ok = res.write(chunk)
    })
    if (ok) return resume(Effect.succeed(true))
    exchange.whenWritable(res, () => {
      resume(Effect.succeed(true))
      return true
    })
  })

/**
 * Writes a streamed reply with backpressure. Fails with the stream's error (after closing the
 * connection) when the stream fails; stops quietly when the client goes away.
 */
export const writeStream = (
  res: HttpResponse,
  exchange: Exchange,
  reply: Extract<Reply, { _tag: "Stream" }>,
): Effect.Effect<void, unknown> =>
  Effect.gen(function* () {
    if (!exchange.open) return
    const total = reply.length
    res.cork(() => {
      writeHead(res, exchange, reply.status, reply.headers)
      res.writeHeader("content-type", reply.contentType)
    })
    if (total === 0) {
      exchange.ended = true
      res.cork(() => res.end())
      return
    }
    const sent = yield* Stream.runFoldWhileEffect(
      reply.stream,
      0,
      () => exchange.open,
      (sent, chunk) => {
        if (chunk.byteLength === 0) return Effect.succeed(sent)
        if (total === undefined) {
          exchange.bytes += chunk.byteLength
          return Effect.as(writeChunked(res, exchange, chunk), sent + chunk.byteLength)
        }
        // A stream longer than it said: send only what was announced, then close.
        const room = total - sent
        const part = chunk.byteLength > room ? chunk.subarray(0, room) : chunk
        exchange.bytes += part.byteLength
        return Effect.as(writeSized(res, exchange, part, total), sent + part.byteLength)
      },
    ).pipe(Effect.tapError(() => Effect.sync(() => abort(res, exchange))))
    if (!exchange.open) return
    if (total === undefined) {
      exchange.ended = true
      res.cork(() => res.end())
    } else if (sent !== total) {
      // Shorter than announced: closing tells the client the body is truncated.
      abort(res, exchange)
    }
  })
