/**
 * The one way the vendor clients send a request and read a JSON answer: a timeout, every failure
 * sorted into `VendorRejectedKey` or `VendorUnavailable`, and the body decoded with a schema of
 * only the fields we use (vendors add fields all the time; unknown ones are ignored).
 *
 * The key travels only in a request header. The header names that carry it are added to
 * platform's redacted header names, so a tracing span never records it either.
 */
import { Headers, type HttpClient, type HttpClientError, type HttpClientRequest } from "@effect/platform"
import { Duration, Effect, ParseResult, Redacted, Schema } from "effect"
import type { Vendor } from "../../schema/Provider.ts"
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
}

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
): Effect.Effect<A, VendorRejectedKey | VendorUnavailable> => {
  const { vendor } = dialect
  const unavailable = (status: number, message: string) => new VendorUnavailable({ vendor, status, message })
  const decode = Schema.decodeUnknown(schema, { onExcessProperty: "ignore" })
  return http.execute(request).pipe(
    Effect.flatMap((response) => Effect.map(response.text, (text) => ({ status: response.status, text }))),
    Effect.catchAll((error) => Effect.fail(unavailable(0, describeTransport(error)))),
    Effect.timeoutFail({
      duration: Duration.millis(endpoint.timeoutMs),
      onTimeout: () => unavailable(0, `no answer within ${endpoint.timeoutMs} ms`),
    }),
    Effect.flatMap(({ status, text }) => {
      const body = parseJson(text)
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
      return Effect.fail(
        dialect.rejectsKey(status, body)
          ? new VendorRejectedKey({ vendor, status, message })
          : unavailable(status, message),
      )
    }),
    Effect.locallyWith(Headers.currentRedactedNames, (names) => [...names, ...keyHeaders]),
  )
}

/** Safety net for a vendor that keeps answering "there is more": stop after this many pages. */
export const maxPages = 100
