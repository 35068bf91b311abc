/**
 * The gateway's HTTP server: one uWS app whose single catch-all handler routes every request
 * through the route table and runs the handler as an Effect fiber on the layer's runtime.
 *
 * Per request, synchronously inside uWS's callback (uWS's `HttpRequest` dies when it returns):
 * headers/path/query are copied, `onAborted` is registered, the route is matched, the rate limit
 * is taken (not for `unlimited` routes) and, for routes with a body, `onData` is attached. A route
 * with an answer in memory (`Route.now`) is answered there and then; otherwise a fiber runs decode
 * → handler → write. A client abort interrupts that fiber; nothing is written afterwards.
 *
 * Every error leaves as `{error, code}` with the status of `schema/Errors.ts`. An `ApiError`
 * keeps its code; any other failure or defect becomes `500 internal` with a fixed message, and the
 * cause is logged with the request id (never sent). One access line is logged per request.
 *
 * Content type: a JSON route refuses a body that is not `application/json` with
 * `400 invalid_request` naming `content-type` (the contract has no 415 code, and clients switch
 * on codes), before reading the body.
 */

import uWS from "uWebSockets.js"
import type { Fiber, Scope } from "effect"
import { Cause, Context, Effect, FiberId, FiberSet, Layer, Option, Schema } from "effect"
import { defineSettings, env } from "../core/Config.ts"
import { Nats } from "../core/Nats.ts"
import { decodeBody, decodeJsonBody, jsonDepthMax, nestsDeeperThan } from "../schema/Decode.ts"
import { ApiError } from "../schema/Errors.ts"
import * as AccessLog from "./AccessLog.ts"
import { bearerOf } from "./auth/Bearer.ts"
import { BodySource, isJson, JSON_LIMIT } from "./Body.ts"
import { RateLimit } from "./RateLimit.ts"
import { parseQuery, type Request, readHeaders, requestIdOf } from "./Request.ts"
import type { Reply } from "./Response.ts"
import { abort, Exchange, error as errorReply, json, writeStream, writeWhole } from "./Response.ts"
import * as Router from "./Router.ts"

/** HTTP settings: `HANGAR_HTTP_ADDR` is `host:port` (`[v6]:port` for IPv6); port 0 picks a free one. */
export const HttpSettings = defineSettings("gateway/HttpSettings", { addr: "127.0.0.1:8080" }, (d) => ({
  addr: env.string("HTTP_ADDR", d.addr),
}))

/** The running server: where it listens (the real port when the settings said 0). */
export class Server extends Context.Tag("gateway/Server")<
  Server,
  { readonly host: string; readonly port: number; readonly url: string }
>() {}

/** A listen address that could not be parsed or bound. */
export class ListenError extends Error {
  readonly _tag = "ListenError"
}

/** Splits `host:port` / `[v6]:port`; a defect on a malformed address (settings are checked at start). */
export const parseAddr = (addr: string): { readonly host: string; readonly port: number } => {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(addr)
  const port = m ? Number(m[3]) : Number.NaN
  if (!m || port > 65535) throw new ListenError(`HANGAR_HTTP_ADDR ${addr}: expected host:port`)
  return { host: m[1] ?? m[2] ?? "", port }
}

const internalError = ApiError.internal()

/**
 * While NATS is unreachable: `503` with `Retry-After`, and the code `internal` that the spec tells
 * clients to retry (the spec has no code of its own for it), instead of each request waiting for
 * its own timeout and failing `500`; a request that failed while the store was not settled (down,
 * frozen, back less than 10 s, or an actor's ask unanswered: `Nats.settled`) answers the same.
 */
export const UNREACHABLE_RETRY_AFTER_S = 2
const unreachableReply = json(ApiError.internal("the service is not answering just now; retry").body, {
  status: 503,
  headers: { "retry-after": String(UNREACHABLE_RETRY_AFTER_S) },
})
const text = new TextDecoder()

interface Compiled {
  readonly query: ((raw: unknown) => Effect.Effect<unknown, ApiError>) | undefined
  readonly body: ((text: string) => Effect.Effect<unknown, ApiError>) | undefined
}

// The body of a route whose schema comes after auth (`authRoute`, `Schema.Unknown` here): JSON
// parsed synchronously; a body it refuses takes `decodeJsonBody`'s path for the same error.
const decodeAnyJson = decodeJsonBody(Schema.Unknown)
const parseJsonBody = (text: string): Effect.Effect<unknown, ApiError> => {
  if (!nestsDeeperThan(text, jsonDepthMax)) {
    try {
      return Effect.succeed(JSON.parse(text) as unknown)
    } catch {
      // Not JSON: refused below.
    }
  }
  return decodeAnyJson(text)
}

// Query failures say "query" so a caller does not look for the field in the body.
const queryDecoder = (schema: Router.InputSchema<unknown>) => {
  const decode = decodeBody(schema)
  return (raw: unknown) =>
    Effect.mapError(decode(raw), (e) => ApiError.invalidRequest(`query ${e.message.replace(/^body: /, "")}`))
}

// The reply for a failed request: its ApiError, or a logged, detail-free 500. An interruption
// alone (the client went away, or shutdown) stays an interruption: nobody is there to answer.
const replyForCause = (cause: Cause.Cause<unknown>, reachable: () => boolean): Effect.Effect<Reply> => {
  if (Cause.isInterruptedOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure) && failure.value instanceof ApiError) {
    // A handler's own `internal` for a store that went away is the store's too.
    if (failure.value.code === "internal" && !reachable())
      return Effect.as(Effect.logWarning("request failed while NATS is unreachable", cause), unreachableReply)
    return Effect.succeed(errorReply(failure.value))
  }
  if (!reachable())
    return Effect.as(Effect.logWarning("request failed while NATS is unreachable", cause), unreachableReply)
  return Effect.as(Effect.logError("request failed", cause), errorReply(internalError))
}

/**
 * One request, from uWS's callback to its access line. A class, not closures made per request:
 * those would each be named at run time under tsx (esbuild's `keepNames`), a cost per request.
 */
class Call {
  readonly started = performance.now()
  readonly ex: Exchange
  /** The route pattern that matched (`-` for none), as the access line names it. */
  route = "-"
  /** The handler's fiber while it runs (a client abort interrupts it). */
  fiber: Fiber.RuntimeFiber<void, unknown> | undefined = undefined
  constructor(
    requestId: string,
    readonly method: string,
    private readonly accessLog: AccessLog.AccessLog,
  ) {
    this.ex = new Exchange(requestId)
  }

  logAccess(): void {
    const ex = this.ex
    this.accessLog({
      request_id: ex.requestId,
      method: this.method,
      route: this.route,
      status: ex.aborted && ex.status === 0 ? 499 : ex.status,
      ms: Math.round((performance.now() - this.started) * 100) / 100,
      bytes: ex.bytes,
      ...(ex.aborted ? { aborted: true as const } : {}),
    })
  }
}

function requestOf(
  method: string,
  path: string,
  route: string,
  params: Record<string, string>,
  query: unknown,
  body: unknown,
  headers: Readonly<Record<string, string>>,
  ex: Exchange,
): Request<Record<string, string>, unknown, unknown> {
  return { method, path, route, params, query, body, headers, requestId: ex.requestId }
}

// The peer's address, asked of uWS only for a request without a bearer token (its rate limit
// key) or one whose token is refused or comes while some address's tokens were refused lately,
// and in its binary form (4 or 16 bytes, one character each), which uWS makes faster than the
// text: a few µs a request either way.
function remoteAddressOf(res: uWS.HttpResponse): string {
  return String.fromCharCode.apply(null, new Uint8Array(res.getRemoteAddress()) as unknown as number[])
}

/** Starts the server for `routes`, listening until the layer's scope closes. */
export const make = <R>(
  routes: ReadonlyArray<Router.Route<R>>,
): Effect.Effect<
  Context.Tag.Service<Server>,
  ListenError,
  R | RateLimit | "gateway/HttpSettings" | Scope.Scope
> =>
  Effect.gen(function* () {
    const settings = yield* HttpSettings.Tag
    const { host, port } = yield* Effect.try({
      try: () => parseAddr(settings.addr),
      catch: (e) => e as ListenError,
    })
    const rateLimit = yield* RateLimit
    // A gateway without NATS (tests of the server alone) is always reachable.
    const nats = yield* Effect.serviceOption(Nats)
    const reachable = Option.isSome(nats) ? nats.value.reachable : () => true
    // A failure while the store is away, frozen or just back is the store's, not ours: 503, retry.
    const storeUp = Option.isSome(nats) ? nats.value.settled : () => true
    // Handler fibers belong to this set: closing the layer interrupts the ones still running.
    const run = yield* FiberSet.makeRuntime<R>()
    // What `Route.now` answers from, and the access log, both of the runtime the fibers run in.
    const context = yield* Effect.context<R>()
    const accessLog = yield* AccessLog.make
    const router = Router.make(routes)
    const compiled = new Map<Router.Route<R>, Compiled>()
    for (const r of routes) {
      compiled.set(r, {
        query: r.query ? queryDecoder(r.query) : undefined,
        body: r.body ? (r.body === Schema.Unknown ? parseJsonBody : decodeJsonBody(r.body)) : undefined,
      })
    }

    const handle = (res: uWS.HttpResponse, req: uWS.HttpRequest): void => {
      const headers = readHeaders(req)
      const method = req.getMethod().toUpperCase()
      const path = req.getUrl()
      const rawQuery = req.getQuery() ?? ""
      const call = new Call(requestIdOf(headers["x-request-id"]), method, accessLog)
      const ex = call.ex
      res.onAborted(() => {
        // Our own close (a stream that failed midway) also lands here: that fiber has work left.
        if (ex.ended) return
        ex.aborted = true
        call.fiber?.unsafeInterruptAsFork(FiberId.none)
      })
      const match = router.match(method, path)
      if (match._tag === "Found") call.route = match.route.path

      // Decided before the fiber starts, because onData must be attached now or never.
      let early: Reply | undefined
      let body: BodySource | undefined
      const retryAfter =
        match._tag === "Found" && match.route.unlimited
          ? 0
          : rateLimit.take(headers.authorization, () => remoteAddressOf(res))
      if (retryAfter > 0) {
        early = errorReply(ApiError.rateLimited(), { "retry-after": String(retryAfter) })
      } else if (match._tag === "NotFound") {
        early = errorReply(ApiError.notFound())
      } else if (match._tag === "MethodNotAllowed") {
        early = errorReply(ApiError.methodNotAllowed(method), { allow: match.allow.join(", ") })
      } else if (!match.route.storeless && !reachable()) {
        early = unreachableReply
      } else if (match.route.body || match.route.stream) {
        const limit = match.route.bodyLimit ?? JSON_LIMIT
        const length = headers["content-length"]
        if (match.route.body && !isJson(headers["content-type"])) {
          early = errorReply(ApiError.invalidRequest("content-type: must be application/json"))
        } else if (length !== undefined && Number(length) > limit) {
          early = errorReply(ApiError.payloadTooLarge(limit))
        } else {
          body = new BodySource(res, ex, limit)
        }
      }

      // Refusals decided above, and answers a route has in memory (`Route.now`), are written here
      // and now: no fiber, and the connection's next request is read sooner.
      if (early !== undefined) {
        if (early._tag !== "Stream") writeWhole(res, ex, early)
        call.logAccess()
        return
      }
      if (match._tag !== "Found") return
      const r = match.route
      // A bearer token refused (made up, revoked, expired) counts against the client's address
      // (`RateLimit.ts`); asked before the answer is written, while uWS still has the request.
      const chargeRefusal = (status: number) => {
        if (status === 401 && ex.open && bearerOf(headers.authorization) !== undefined)
          rateLimit.refused(() => remoteAddressOf(res))
      }
      const c = compiled.get(r)!

      let defect: { readonly cause: unknown } | undefined
      if (r.now !== undefined && body === undefined && c.query === undefined) {
        let reply: Reply | undefined
        try {
          const request = requestOf(
            method,
            path,
            r.path,
            match.params,
            parseQuery(rawQuery),
            undefined,
            headers,
            ex,
          )
          reply = r.now(request, context)
        } catch (cause) {
          defect = { cause }
        }
        if (reply !== undefined && reply._tag !== "Stream") {
          chargeRefusal(reply.status)
          writeWhole(res, ex, reply)
          call.logAccess()
          return
        }
      }
      const program: Effect.Effect<Reply, unknown, R> =
        defect !== undefined
          ? Effect.die(defect.cause)
          : Effect.gen(function* () {
              const raw = parseQuery(rawQuery)
              const query = c.query ? yield* c.query(raw) : raw
              const value = r.stream
                ? body!.stream
                : c.body
                  ? yield* Effect.flatMap(body!.readAll, (bytes) => c.body!(text.decode(bytes)))
                  : undefined
              return yield* r.handler(
                requestOf(method, path, r.path, match.params, query, value, headers, ex),
              )
            })

      // Written from the fiber. A stream failing midway has closed the connection; it is logged.
      const send = (reply: Reply): Effect.Effect<void> => {
        if (reply._tag !== "Stream") {
          chargeRefusal(reply.status)
          writeWhole(res, ex, reply)
          return Effect.void
        }
        return Effect.catchAllCause(writeStream(res, ex, reply), (cause) =>
          Cause.isInterruptedOnly(cause)
            ? Effect.failCause(cause as Cause.Cause<never>)
            : Effect.logError("response stream failed", cause),
        )
      }
      const full = Effect.matchCauseEffect(program, {
        onSuccess: send,
        onFailure: (cause) => Effect.flatMap(replyForCause(cause, storeUp), send),
      }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            // Interrupted without a client abort (shutdown): close rather than leave it hanging.
            if (ex.open) abort(res, ex)
            call.logAccess()
          }),
        ),
        Effect.annotateLogs("request_id", ex.requestId),
      )
      const fiber = run(full, { immediate: true })
      if (fiber.unsafePoll() === null) call.fiber = fiber
    }

    const app = uWS.App()
    app.any("/*", handle)

    const listenSocket = yield* Effect.acquireRelease(
      Effect.async<uWS.us_listen_socket, ListenError>((resume) => {
        app.listen(host, port, (socket) => {
          resume(
            socket
              ? Effect.succeed(socket)
              : Effect.fail(new ListenError(`cannot listen on ${settings.addr}`)),
          )
        })
      }),
      // Closing the listen socket alone would leave keep-alive connections served by a closed
      // layer; `close()` (in the runtime, missing from the typings) also ends every connection.
      (socket) =>
        Effect.sync(() => {
          uWS.us_listen_socket_close(socket)
          ;(app as unknown as { close: () => void }).close()
        }),
    )
    const bound = uWS.us_socket_local_port(listenSocket as unknown as uWS.us_socket)
    const url = `http://${host.includes(":") ? `[${host}]` : host}:${bound}`
    yield* Effect.logInfo("gateway listening").pipe(Effect.annotateLogs({ url }))
    return { host, port: bound, url }
  })

/** The server as a layer over `routes`; handlers get their services `R` from the layer's context. */
export const layer = <R>(
  routes: ReadonlyArray<Router.Route<R>>,
): Layer.Layer<Server, ListenError, R | RateLimit | "gateway/HttpSettings"> =>
  Layer.scoped(Server, make(routes))
