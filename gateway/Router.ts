/**
 * The route table: routes are data (`{method, path, body?, query?, handler}`) that route groups
 * declare with `route` / `streamRoute` and the server compiles once into a segment tree.
 *
 * Matching is by whole path segments: a literal segment matches itself, `:name` matches any one
 * non-empty segment (percent-decoded into `params.name`). Literal segments win over parameters, so
 * `/v1/runs/wait` and `/v1/runs/:id` can coexist. A path with no route is `not_found`; a path with
 * routes for other methods only is `method_not_allowed` with the methods it takes (for `Allow`).
 */
import type { Context, Effect, Schema, Stream } from "effect"
import type { ApiError } from "../schema/Errors.ts"
import type { Request } from "./Request.ts"
import type { Reply } from "./Response.ts"

/** The HTTP methods a route can take. */
export type Method = "GET" | "POST" | "PUT" | "PATCH" | "DELETE"

/** The path parameters of a pattern: `"/v1/runs/:id/commands/:cid"` → `{id: string, cid: string}`. */
export type Params<P extends string> = P extends `${string}:${infer Name}/${infer Rest}`
  ? { readonly [K in Name]: string } & Params<`/${Rest}`>
  : P extends `${string}:${infer Name}`
    ? { readonly [K in Name]: string }
    : {}

/** A schema decoding a value from its JSON (or query-string) form, with no requirements. */
// biome-ignore lint/suspicious/noExplicitAny: the encoded side is whatever JSON.parse gives
export type InputSchema<A> = Schema.Schema<A, any, never>

/** The raw query parameters: the first value of each name. */
export type RawQuery = Readonly<Record<string, string>>

// biome-ignore lint/suspicious/noExplicitAny: erased in `Route`, typed by `route`/`streamRoute`
type AnyRequest = Request<any, any, any>

/**
 * One route as the server sees it. `handler` may fail with any error: an `ApiError` leaves with
 * its code and status, anything else (and every defect) as `500 internal` with no detail.
 */
export interface Route<R> {
  readonly method: Method
  readonly path: string
  /** Schema of a JSON body; the body must be `application/json` and at most `bodyLimit` bytes. */
  readonly body?: InputSchema<unknown> | undefined
  /** Raw streaming body (no content-type check), at most `bodyLimit` bytes. */
  readonly stream?: boolean | undefined
  /** Byte limit of the body; the server's default (1 MiB) when absent. */
  readonly bodyLimit?: number | undefined
  /** Schema of the query parameters (decoded from `RawQuery`). */
  readonly query?: InputSchema<unknown> | undefined
  /** Answers without NATS (health): not refused while NATS is unreachable. */
  readonly storeless?: boolean | undefined
  /**
   * Not rate limited (health). A load balancer's probes come from the address every request it
   * forwards comes from, so they would share that address's bucket and be refused in a flood of
   * others' requests; and a refusal would cost this gateway as much as the answer.
   */
  readonly unlimited?: boolean | undefined
  // biome-ignore lint/suspicious/noExplicitAny: erased here, typed by `route`/`streamRoute`
  readonly handler: (request: Request<any, any, any>) => Effect.Effect<Reply, unknown, R>
  /**
   * The same answer as `handler`'s, from memory, when it can be had at once; `undefined` when it
   * cannot (then `handler` runs). The server writes it inside uWS's callback, with no fiber. Only
   * for routes without a body or a query schema.
   */
  readonly now?: ((request: AnyRequest, services: Context.Context<R>) => Reply | undefined) | undefined
}

/** A route with a JSON body (or none); `handler` receives typed params, query and body. */
export const route = <const P extends string, B = undefined, Q = RawQuery, E = ApiError, R = never>(spec: {
  readonly method: Method
  readonly path: P
  readonly body?: InputSchema<B>
  readonly bodyLimit?: number
  readonly query?: InputSchema<Q>
  readonly storeless?: boolean
  readonly unlimited?: boolean
  readonly handler: (request: Request<Params<P>, B, Q>) => Effect.Effect<Reply, E, R>
  /** `handler`'s answer from memory when it can be had at once (see `Route.now`). */
  readonly now?: (request: Request<Params<P>, B, Q>, services: Context.Context<R>) => Reply | undefined
}): Route<R> => spec as Route<R>

/**
 * A route whose body is read as a byte stream with backpressure (the client is paused while the
 * handler does not pull), for uploads; `bodyLimit` is enforced from `content-length` and while
 * streaming (the stream then fails with `payload_too_large`).
 */
export const streamRoute = <const P extends string, Q = RawQuery, E = ApiError, R = never>(spec: {
  readonly method: Method
  readonly path: P
  readonly bodyLimit: number
  readonly query?: InputSchema<Q>
  readonly handler: (
    request: Request<Params<P>, Stream.Stream<Uint8Array, ApiError>, Q>,
  ) => Effect.Effect<Reply, E, R>
}): Route<R> => ({ ...spec, stream: true }) as Route<R>

/** What a path and method found in the table. */
export type Match<R> =
  | { readonly _tag: "Found"; readonly route: Route<R>; readonly params: Record<string, string> }
  | { readonly _tag: "MethodNotAllowed"; readonly allow: ReadonlyArray<Method> }
  | { readonly _tag: "NotFound" }

interface Node<R> {
  readonly literal: Map<string, Node<R>>
  param: { readonly name: string; readonly node: Node<R> } | undefined
  readonly routes: Map<Method, Route<R>>
}

const newNode = <R>(): Node<R> => ({ literal: new Map(), param: undefined, routes: new Map() })

/** A compiled route table. */
export interface Router<R> {
  /** Finds the route for `method` and the raw (undecoded) `path`, without the query string. */
  readonly match: (method: string, path: string) => Match<R>
}

// `/` alone is the empty path (the console's home); any other path ending in `/` matches nothing.
const segmentsOf = (path: string): ReadonlyArray<string> | undefined =>
  path === "/"
    ? []
    : path.length > 1 && path.startsWith("/") && !path.endsWith("/")
      ? path.slice(1).split("/")
      : undefined

/** Compiles `routes`; a malformed pattern or a duplicate (method, pattern) is a programming error. */
export const make = <R>(routes: ReadonlyArray<Route<R>>): Router<R> => {
  const root = newNode<R>()
  for (const r of routes) {
    const segments = segmentsOf(r.path)
    if (!segments || segments.some((s) => s === "" || s === ":"))
      throw new Error(`bad route pattern ${r.path}`)
    let node = root
    for (const s of segments) {
      if (s.startsWith(":")) {
        const name = s.slice(1)
        if (node.param && node.param.name !== name) {
          throw new Error(`route ${r.path}: parameter :${name} conflicts with :${node.param.name}`)
        }
        node.param ??= { name, node: newNode() }
        node = node.param.node
      } else {
        let next = node.literal.get(s)
        if (!next) {
          next = newNode()
          node.literal.set(s, next)
        }
        node = next
      }
    }
    if (node.routes.has(r.method)) throw new Error(`duplicate route ${r.method} ${r.path}`)
    node.routes.set(r.method, r)
  }

  // Depth-first, literal before parameter; returns the first node with any route at the full depth.
  const find = (
    node: Node<R>,
    segments: ReadonlyArray<string>,
    i: number,
    params: Array<string>,
  ): Node<R> | undefined => {
    if (i === segments.length) return node.routes.size > 0 ? node : undefined
    const s = segments[i]!
    const lit = node.literal.get(s)
    if (lit) {
      const found = find(lit, segments, i + 1, params)
      if (found) return found
    }
    if (node.param && s !== "") {
      params.push(s)
      const found = find(node.param.node, segments, i + 1, params)
      if (found) return found
      params.pop()
    }
    return undefined
  }

  const notFound: Match<R> = { _tag: "NotFound" }

  // The answers for paths without parameters, made once: such a path is one lookup, and finds the
  // same node as the walk (a node holding routes at the full depth, literals first).
  const fixed = new Map<string, { readonly found: Map<string, Match<R>>; readonly other: Match<R> }>()
  const noParams: Record<string, string> = Object.freeze({}) as Record<string, string>
  for (const r of routes) {
    if (r.path.includes("/:") || fixed.has(r.path)) continue
    const node = find(root, segmentsOf(r.path)!, 0, [])!
    const found = new Map<string, Match<R>>()
    for (const [method, route] of node.routes) found.set(method, { _tag: "Found", route, params: noParams })
    fixed.set(r.path, { found, other: { _tag: "MethodNotAllowed", allow: [...node.routes.keys()].sort() } })
  }

  return {
    match: (method, path) => {
      const known = fixed.get(path)
      if (known !== undefined) return known.found.get(method) ?? known.other
      const segments = segmentsOf(path)
      if (!segments) return notFound
      const values: Array<string> = []
      const node = find(root, segments, 0, values)
      if (!node) return notFound
      const route = node.routes.get(method as Method)
      if (!route) return { _tag: "MethodNotAllowed", allow: [...node.routes.keys()].sort() }
      const params: Record<string, string> = {}
      if (values.length > 0) {
        const names = route.path.split("/").filter((s: string) => s.startsWith(":"))
        for (let k = 0; k < names.length; k++) {
          let value = values[k]!
          try {
            value = decodeURIComponent(value)
          } catch {
            return notFound
          }
          params[names[k]!.slice(1)] = value
        }
      }
      return { _tag: "Found", route, params }
    },
  }
}
