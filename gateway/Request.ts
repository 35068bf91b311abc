/**
 * What a handler receives. Everything is copied out of uWS's `HttpRequest` synchronously (that
 * object is only valid until the uWS handler returns), so a handler may read it at any time.
 */
import { randomBytes } from "node:crypto"

/** A request as handed to a route's handler: typed path params, query and body. */
export interface Request<P, B, Q> {
  /** Upper-case method. */
  readonly method: string
  /** The raw path, without the query string. */
  readonly path: string
  /** The route pattern that matched, e.g. `/v1/runs/:id` (what the access log names). */
  readonly route: string
  readonly params: P
  readonly query: Q
  /** The decoded JSON body; for a `streamRoute`, the body's byte stream (pull it at most once). */
  readonly body: B
  /** Request headers by lower-case name; repeated headers are joined with ", ". */
  readonly headers: Readonly<Record<string, string>>
  /** The request id echoed in `x-request-id` and in the access log. */
  readonly requestId: string
}

/** Lower-case header names to values, copied from uWS's request. */
export const readHeaders = (req: { forEach: (cb: (key: string, value: string) => void) => void }) => {
  const headers: Record<string, string> = {}
  req.forEach((key, value) => {
    const seen = headers[key]
    headers[key] = seen === undefined ? value : `${seen}, ${value}`
  })
  return headers
}

/** Parses a query string (`a=1&b=2`, no `?`) into the first value of each name. */
export const parseQuery = (query: string): Record<string, string> => {
  const out: Record<string, string> = {}
  if (query === "") return out
  for (const [k, v] of new URLSearchParams(query)) if (!(k in out)) out[k] = v
  return out
}

// An incoming id is echoed only when it is short and plain, so it cannot inject into logs or headers.
const SANE_ID = /^[A-Za-z0-9._:-]{1,128}$/

// A random per-process prefix and a counter: unique across gateways without a CSPRNG call per
// request (ids are correlation handles, not secrets).
const prefix = randomBytes(9).toString("base64url")
let counter = 0

/** The incoming `x-request-id` when it looks sane, else a fresh `req_<process prefix><counter>`. */
export const requestIdOf = (incoming: string | undefined): string =>
  incoming !== undefined && SANE_ID.test(incoming) ? incoming : `req_${prefix}${(++counter).toString(36)}`
