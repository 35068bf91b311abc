/**
 * The one way the vendor clients send a request and read a JSON answer: a timeout, every failure
 * sorted into `VendorRejectedKey` or `VendorUnavailable`, and the body decoded with a schema of
 * only the fields we use (vendors add fields all the time; unknown ones are ignored).
 *
 * The key travels only in a request header. The header names that carry it are added to
 * platform's redacted header names, so a tracing span never records it either.
 *
 * Two ways to sort an error answer: `sendJson` (the catalog) knows only "bad key" and "unavailable";
 * `sendChat` (a model turn) also knows "refused for good" (`ChatRefused`: an invalid request, no
 * quota, a feature the organization disabled), which the dialect's `refuses` decides and which is
 * checked before the key test (Anthropic may answer a disabled feature with a 403).
 */
import {
  Headers,
  type HttpClient,
  type HttpClientError,
  type HttpClientRequest,
  type HttpClientResponse,
} from "@effect/platform"
import { Duration, Effect, Option, ParseResult, Redacted, Schema, Stream } from "effect"
import { createParser } from "eventsource-parser"
import type { Vendor } from "../../schema/Provider.ts"
import { type CallUsage, ChatRefused, type Item, type Part, type ToolCall } from "./Chat.ts"
import { scrubKey, VendorRejectedKey, VendorUnavailable } from "./Errors.ts"

/** Where and how to reach one vendor with one key. */
export interface Endpoint {
  readonly baseUrl: string
  readonly key: Redacted.Redacted<string>
  readonly timeoutMs: number
}

/** How a vendor says things: which failures mean "bad key", and where its error message sits. */
export interface Dialect {
  readonly vendor: Vendor
  /** Whether an error answer means the key itself was refused. */
  readonly rejectsKey: (status: number, body: unknown) => boolean
  /** The vendor's message in an error body, if it has one. */
  readonly messageOf: (body: unknown) => string | undefined
  /** For chat calls: whether an error answer refuses the request for good (see `sendChat`). */
  readonly refuses?: (status: number, body: unknown) => boolean
  /** A wait the error body asks for, beyond the headers (Google's `RetryInfo`). */
  readonly retryAfterOf?: (body: unknown) => number | undefined
}

/** Longest wait a vendor's hint is followed for; a run's own timeout still ends the run first. */
export const retryAfterMaxMs = 15 * 60_000

/**
 * The wait an error answer asks for, in ms: `retry-after-ms` (OpenAI), `retry-after` in seconds or
 * as an HTTP date (all three), or the dialect's reading of the body; none when it asks for none.
 */
export const retryAfterOf = (
  headers: Readonly<Record<string, string | undefined>>,
  body: unknown,
  dialect: Dialect,
  now: number = Date.now(),
): number | undefined => {
  const ms = Number(headers["retry-after-ms"])
  const after = headers["retry-after"]
  const seconds = after === undefined || after.trim() === "" ? Number.NaN : Number(after)
  const date = after === undefined || !Number.isNaN(seconds) ? Number.NaN : Date.parse(after) - now
  const hint = [ms, seconds * 1000, date, dialect.retryAfterOf?.(body) ?? Number.NaN].find(
    (n) => Number.isFinite(n) && n >= 0,
  )
  return hint === undefined ? undefined : Math.min(Math.ceil(hint), retryAfterMaxMs)
}

/** The statuses every vendor uses for a request that cannot succeed as sent. */
export const refusedStatuses: ReadonlySet<number> = new Set([400, 404, 413, 422])

/** Header names that may carry a vendor key, beyond platform's defaults (authorization, x-api-key). */
const keyHeaders = ["x-goog-api-key"]

/** The URL of `path` under a configured base URL that may or may not end in `/`. */
export const urlOf = (baseUrl: string, path: string): string => `${baseUrl.replace(/\/+$/, "")}${path}`

const isObject = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null

/** `body.error.message` when it is a string: the shape all three vendors use for errors. */
export const errorMessageOf = (body: unknown): string | undefined => {
  const error = isObject(body) ? body.error : undefined
  const message = isObject(error) ? error.message : undefined
  return typeof message === "string" ? message : undefined
}

const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

// A network-level failure described without the URL or headers: the system error code is enough.
const describeTransport = (error: HttpClientError.HttpClientError): string => {
  let cause: unknown = error.cause
  for (let depth = 0; depth < 4 && isObject(cause); depth++) {
    if (typeof cause.code === "string") return `network error (${cause.code})`
    cause = cause.cause
  }
  return error.reason === "Transport" ? "network error" : `could not read the answer (${error.reason})`
}

/** What an exchange can fail with once the answer is sorted. */
type Sorted<R> = VendorRejectedKey | VendorUnavailable | R

/** One server-sent event: its `event:` name (if any) and its `data:` parsed as JSON. */
export interface SseEvent {
  readonly event: string | undefined
  readonly data: unknown
}

/**
 * Builds a streamed turn's answer from its events, in the shape the vendor's non-streamed answer
 * has (so one schema and one `replyOf` serve both).
 */
export interface Assembler {
  /** Takes one event; answers the vendor's words when the event reports a failure mid-stream. */
  readonly push: (event: SseEvent) => string | undefined
  /** The whole answer once the stream said it is complete, else `undefined`. */
  readonly result: () => unknown
}

// The most one event (or an unfinished line) may hold before the stream is given up as broken.
const SSE_MAX_BUFFER_CHARS = 64 * 1024 * 1024

/**
 * Splits a text stream of server-sent events into events (`eventsource-parser`: every line ending
 * the spec allows, `data:` lines joined, comments and `id:`/`retry:` passed over). A stream that
 * holds more than 64 Mi characters without ending an event fails with `broken`.
 */
const sseEvents = <E, R, B>(
  text: Stream.Stream<string, E, R>,
  broken: (message: string) => B,
): Stream.Stream<SseEvent, E | B, R> =>
  Stream.suspend(() => {
    let ready: Array<SseEvent> = []
    let failure: string | undefined
    const parser = createParser({
      maxBufferSize: SSE_MAX_BUFFER_CHARS,
      onEvent: (message) => {
        ready.push({ event: message.event, data: parseJson(message.data) })
      },
      onError: (error) => {
        failure = error.message
      },
    })
    return text.pipe(
      Stream.mapConcatEffect((chunk) => {
        if (failure === undefined) parser.feed(chunk)
        if (failure !== undefined) return Effect.fail(broken(`the answer's stream is malformed: ${failure}`))
        const out = ready
        ready = []
        return Effect.succeed(out)
      }),
    )
  })

const exchange = <A, I, R>(
  http: HttpClient.HttpClient,
  dialect: Dialect,
  endpoint: Endpoint,
  request: HttpClientRequest.HttpClientRequest,
  schema: Schema.Schema<A, I, never>,
  refused: (status: number, body: unknown, message: string) => R | undefined,
  assembler?: () => Assembler,
): Effect.Effect<A, Sorted<R>> => {
  const { vendor } = dialect
  const unavailable = (status: number, message: string, retryAfterMs?: number) =>
    new VendorUnavailable({
      vendor,
      status,
      message,
      ...(retryAfterMs === undefined ? {} : { retryAfterMs }),
    })
  const decode = Schema.decodeUnknown(schema, { onExcessProperty: "ignore" })
  const transport = (error: HttpClientError.HttpClientError) => unavailable(0, describeTransport(error))
  const isStreamed = (response: HttpClientResponse.HttpClientResponse) =>
    assembler !== undefined &&
    response.status >= 200 &&
    response.status < 300 &&
    (response.headers["content-type"] ?? "").startsWith("text/event-stream")
  // A streamed answer is read event by event, each within the timeout (a long answer that keeps
  // coming is not cut).
  const readStream = (response: HttpClientResponse.HttpClientResponse, assembling: Assembler) =>
    sseEvents(Stream.decodeText(response.stream).pipe(Stream.mapError(transport)), (message) =>
      unavailable(200, message),
    ).pipe(
      Stream.timeoutFail(
        () => unavailable(0, `no event of the answer within ${endpoint.timeoutMs} ms`),
        Duration.millis(endpoint.timeoutMs),
      ),
      Stream.runForEach((event) => {
        const failed = assembling.push(event)
        return failed === undefined ? Effect.void : Effect.fail(unavailable(200, failed))
      }),
      Effect.flatMap(() => {
        const whole = assembling.result()
        return whole === undefined
          ? Effect.fail(unavailable(200, "the answer's stream ended before it was complete"))
          : Effect.succeed(whole)
      }),
    )
  return http.execute(request).pipe(
    Effect.mapError(transport),
    // A whole answer within the timeout, headers and body together; a stream's first bytes too.
    Effect.flatMap((response) =>
      isStreamed(response)
        ? Effect.succeed({ response, whole: Option.none<unknown>() })
        : response.text.pipe(
            Effect.mapError(transport),
            Effect.map((text) => ({ response, whole: Option.some(parseJson(text)) })),
          ),
    ),
    Effect.timeoutFail({
      duration: Duration.millis(endpoint.timeoutMs),
      onTimeout: () => unavailable(0, `no answer within ${endpoint.timeoutMs} ms`),
    }),
    Effect.flatMap(({ response, whole }) =>
      Effect.map(
        Option.isSome(whole) || assembler === undefined
          ? Effect.succeed(Option.getOrUndefined(whole))
          : readStream(response, assembler()),
        (body) => ({ status: response.status, body, headers: response.headers }),
      ),
    ),
    Effect.scoped,
    Effect.flatMap(({ status, body, headers }): Effect.Effect<A, Sorted<R>> => {
      if (status >= 200 && status < 300) {
        return decode(body).pipe(
          Effect.mapError((error) =>
            unavailable(
              status,
              body === undefined
                ? "the answer is not JSON"
                : `the answer has an unexpected shape (${ParseResult.TreeFormatter.formatErrorSync(error).split("\n")[0]})`,
            ),
          ),
        )
      }
      const said = dialect.messageOf(body) ?? `HTTP ${status}`
      const message = scrubKey(said, Redacted.value(endpoint.key))
      const refusal = refused(status, body, message)
      if (refusal !== undefined) return Effect.fail(refusal)
      return Effect.fail(
        dialect.rejectsKey(status, body)
          ? new VendorRejectedKey({ vendor, status, message })
          : unavailable(status, message, retryAfterOf(headers, body, dialect)),
      )
    }),
    Effect.locallyWith(Headers.currentRedactedNames, (names) => [...names, ...keyHeaders]),
  )
}

/**
 * Sends `request` and decodes a 2xx JSON answer with `schema`. Error answers become
 * `VendorRejectedKey` when the dialect says the key was refused, else `VendorUnavailable`; so do
 * network failures, no answer within `timeoutMs`, and an undecodable body.
 */
export const sendJson = <A, I>(
  http: HttpClient.HttpClient,
  dialect: Dialect,
  endpoint: Endpoint,
  request: HttpClientRequest.HttpClientRequest,
  schema: Schema.Schema<A, I, never>,
): Effect.Effect<A, VendorRejectedKey | VendorUnavailable> =>
  exchange(http, dialect, endpoint, request, schema, () => undefined as never)

/**
 * As `sendJson`, for a model turn: an error answer the dialect's `refuses` picks becomes
 * `ChatRefused` with the vendor's scrubbed words (checked first), then as `sendJson`.
 */
export const sendChat = <A, I>(
  http: HttpClient.HttpClient,
  dialect: Dialect,
  endpoint: Endpoint,
  request: HttpClientRequest.HttpClientRequest,
  schema: Schema.Schema<A, I, never>,
  assembler?: () => Assembler,
): Effect.Effect<A, VendorRejectedKey | VendorUnavailable | ChatRefused> =>
  exchange(
    http,
    dialect,
    endpoint,
    request,
    schema,
    (status, body, message) =>
      dialect.refuses?.(status, body)
        ? new ChatRefused({ provider: dialect.vendor, status, message })
        : undefined,
    assembler,
  )

/** Safety net for a vendor that keeps answering "there is more": stop after this many pages. */
export const maxPages = 100

// Helpers every chat client shares.

/** The items a turn sends: the last `compaction` item and what follows it (it replaces the rest). */
export const liveItems = (items: ReadonlyArray<Item>): ReadonlyArray<Item> => {
  for (let i = items.length - 1; i >= 0; i--) {
    if (items[i]?.role === "compaction") return items.slice(i)
  }
  return items
}

/** How a compaction summary reads when sent to the model as a user message. */
export const compactionText = (summary: string): string =>
  `The earlier part of this conversation was compacted. Summary of it:\n\n${summary}`

/** A tool call's arguments as the model sent them: the JSON object, else the raw text. */
export const parseArguments = (text: string): ToolCall["arguments"] => {
  const parsed = parseJson(text)
  return isObject(parsed) && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : text
}

/** A tool call's arguments as JSON text (an argument that was raw text is sent back as it came). */
export const argumentsText = (args: ToolCall["arguments"]): string =>
  typeof args === "string" ? args : JSON.stringify(args)

/** The vendor state of an item when `vendor` made it, else `undefined` (never shown to another vendor). */
export const vendorData = (
  item: { readonly vendor?: { readonly provider: Vendor; readonly data: unknown } | undefined },
  vendor: Vendor,
): Record<string, unknown> | undefined =>
  item.vendor?.provider === vendor && isObject(item.vendor.data)
    ? (item.vendor.data as Record<string, unknown>)
    : undefined

/** The text parts of a content list, joined. */
export const textOf = (content: ReadonlyArray<Part>): string =>
  content.flatMap((p) => (p.type === "text" ? [p.text] : [])).join("\n")

/** A count from a usage report: a finite non-negative integer, else 0. */
export const count = (n: number | null | undefined): number =>
  typeof n === "number" && Number.isFinite(n) && n > 0 ? Math.floor(n) : 0

/** Usage that adds up several calls (Anthropic's continued turns). */
export const addUsage = (a: CallUsage, b: CallUsage): CallUsage => ({
  input_tokens: a.input_tokens + b.input_tokens,
  cache_read_tokens: a.cache_read_tokens + b.cache_read_tokens,
  cache_write_tokens: a.cache_write_tokens + b.cache_write_tokens,
  output_tokens: a.output_tokens + b.output_tokens,
  web_searches: a.web_searches + b.web_searches,
})

/** A turn's options beyond the request: `noTools` asks the model to answer in text only (summary turns). */
export interface TurnOptions {
  readonly noTools?: boolean
}
