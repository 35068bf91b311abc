/**
 * Routes that carry their access label as data. `authRoute` declares a route like `route` plus
 * `access` (and optionally `whileSuspended`); the server sees an ordinary route whose handler runs
 * the auth step first, then decodes the JSON body with the route's schema, then calls the
 * declared handler with a typed `principal`. So a request without a valid credential gets 401
 * before its body is judged (only the framing checks of the server — content type, size, JSON
 * syntax — come earlier, because they happen while the body is read).
 */
import { Context, Effect, Schema } from "effect"
import type { Nats } from "../../core/Nats.ts"
import type { Storage } from "../../core/Storage.ts"
import { decodeBodyEither } from "../../schema/Decode.ts"
import { ApiError } from "../../schema/Errors.ts"
import * as Idempotency from "../Idempotency.ts"
import type { Request } from "../Request.ts"
import { error as errorReply, type Reply } from "../Response.ts"
import { type InputSchema, type Method, type Params, type RawQuery, type Route, route } from "../Router.ts"
import type { Access, PrincipalFor } from "./Access.ts"
import { Auth } from "./Auth.ts"

/** A request with its principal. */
export type AuthedRequest<P, B, A extends Access> = Request<P, B, RawQuery> & {
  readonly principal: PrincipalFor<A>
}

/**
 * The request with its body and principal, made field by field: a spread of the request costs more
 * than the rest of a request answered from memory (about 1.5 µs).
 */
const authed = <P, B, A extends Access>(
  request: Request<P, unknown, RawQuery>,
  body: B,
  principal: PrincipalFor<A>,
): AuthedRequest<P, B, A> => ({
  method: request.method,
  path: request.path,
  route: request.route,
  params: request.params,
  query: request.query,
  body,
  headers: request.headers,
  requestId: request.requestId,
  principal,
})

/** A route with its access label, as the server and the authorization matrix see it. */
export type AuthRoute<R> = Route<R | Auth | Nats | Storage> & {
  readonly access: Access
  readonly whileSuspended: boolean
}

/** Declares a route with an access label; the handler receives `principal` typed by the label. */
export const authRoute = <
  const P extends string,
  const A extends Access,
  B = undefined,
  E = ApiError,
  R = never,
>(spec: {
  readonly method: Method
  readonly path: P
  readonly access: A
  /** Whether a suspended account may use the route; default: only `GET` routes. */
  readonly whileSuspended?: boolean
  /** The answer holds a secret shown once: an `Idempotency-Key` retry cannot be answered it again. */
  readonly answerHoldsSecret?: boolean
  readonly body?: InputSchema<B>
  readonly bodyLimit?: number
  readonly handler: (request: AuthedRequest<Params<P>, B, A>) => Effect.Effect<Reply, E, R>
  /**
   * `handler`'s answer from memory when it can be had at once (`undefined`: it cannot), for routes
   * without a body; the server then answers inside uWS's callback (see `Route.now`).
   */
  readonly now?: (
    request: AuthedRequest<Params<P>, undefined, A>,
    services: Context.Context<R | Auth | Nats | Storage>,
  ) => Reply | undefined
}): AuthRoute<R> => {
  const whileSuspended = spec.whileSuspended ?? spec.method === "GET"
  // Synchronous: an `Either` takes no fiber steps (a body is decoded on every command's create).
  const decode = spec.body ? decodeBodyEither(spec.body) : undefined
  const base = route({
    method: spec.method,
    path: spec.path,
    // The server parses any JSON (framing checks); the route's schema is applied after auth.
    ...(spec.body ? { body: Schema.Unknown } : {}),
    ...(spec.bodyLimit !== undefined ? { bodyLimit: spec.bodyLimit } : {}),
    handler: (request: Request<Params<P>, unknown, RawQuery>) =>
      Effect.gen(function* () {
        const auth = yield* Auth
        const principal = yield* auth.resolve(spec.access, request.headers, {
          whileSuspended,
          method: request.method,
        })
        const body = decode ? yield* decode(request.body) : (undefined as B)
        const handled = spec.handler(authed(request, body as B, principal as PrincipalFor<A>))
        // Who may reuse an Idempotency-Key: the same credential (a key, or a person) in the same
        // account, so a narrower key never gets the kept answer of a wider one.
        const scope =
          principal._tag === "AccountKey"
            ? `account:${principal.account.id}:key:${principal.key.id}`
            : principal._tag === "AccountPerson"
              ? `account:${principal.account.id}:person:${principal.user}`
              : principal._tag === "Person"
                ? `person:${principal.user}`
                : undefined
        if (scope === undefined) return yield* handled
        return yield* Idempotency.around(request, scope, body, handled, {
          secret: spec.answerHoldsSecret === true,
        })
      }),
  })
  const handlerNow = spec.now
  // The auth step decided from memory: its refusal, or the handler's answer from memory. A `POST`
  // with an `Idempotency-Key` reads and writes KV, so it always takes the handler's path.
  const now: Route<Auth>["now"] = (request, services) => {
    if (spec.body !== undefined) return undefined
    if (request.method === "POST" && request.headers[Idempotency.HEADER] !== undefined) return undefined
    const principal = Context.get(services, Auth).resolveNow(spec.access, request.headers, {
      whileSuspended,
      method: request.method,
    })
    if (principal === undefined) return undefined
    if (principal instanceof ApiError) return errorReply(principal)
    return handlerNow?.(
      authed(request, undefined, principal as PrincipalFor<A>),
      services as Context.Context<R | Auth | Nats | Storage>,
    )
  }
  return { ...base, now, access: spec.access, whileSuspended } as AuthRoute<R>
}
