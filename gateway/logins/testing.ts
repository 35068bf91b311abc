/**
 * Test helper for the login and credit groups: a gateway on port 0 over a real nats-server with
 * the auth step, the account store and the group services given as `services` (a layer over NATS,
 * storage and the account store). Collects every log line.
 */
import { Context, type Context as Ctx, Effect, Exit, Layer, Scope } from "effect"
import * as AccountsStore from "../../core/Accounts.ts"
import { Accounts, type AccountsService } from "../../core/Accounts.ts"
import { IssuerSettings } from "../../core/LocalIssuer.ts"
import * as Log from "../../core/Log.ts"
import * as Nats from "../../core/Nats.ts"
import * as Storage from "../../core/Storage.ts"
import * as Auth from "../auth/Auth.ts"
import * as RateLimit from "../RateLimit.ts"
import type { Route } from "../Router.ts"
import * as Server from "../Server.ts"

/** A running test gateway. */
export interface TestGateway {
  readonly url: string
  readonly accounts: AccountsService
  readonly lines: Array<string>
  /** Runs an effect with the gateway's services. */
  readonly run: <A, E, R>(fx: Effect.Effect<A, E, R>) => Promise<A>
  readonly close: () => Promise<void>
}

/** Starts a gateway serving `routes`; `close` stops it and its NATS connection. */
export const startGateway = async (
  // biome-ignore lint/suspicious/noExplicitAny: route groups differ in requirements, all provided here
  routes: ReadonlyArray<Route<any>>,
  options: {
    readonly natsUrl: string
    readonly prefix: string
    readonly keyFile: string
    // biome-ignore lint/suspicious/noExplicitAny: the groups' services, built over NATS, storage and accounts
    readonly services: Layer.Layer<any, any, any>
  },
): Promise<TestGateway> => {
  const lines: Array<string> = []
  const scope = Effect.runSync(Scope.make())
  const base = Auth.layerAll.pipe(
    Layer.provide(IssuerSettings.layer({ keyFile: options.keyFile })),
    Layer.provideMerge(Storage.layerPrefix(options.prefix)),
    Layer.provideMerge(Nats.layerUrl(options.natsUrl, "hangar-test-gateway")),
  )
  const services = (options.services as unknown as Layer.Layer<never, never, Auth.Auth | Accounts>).pipe(
    Layer.provideMerge(base),
  )
  const layer = Server.layer(routes as unknown as ReadonlyArray<Route<never>>).pipe(
    Layer.provide(RateLimit.layer),
    Layer.provide(RateLimit.RateLimitSettings.layer({ perSecond: 1_000_000, burst: 1_000_000 })),
    Layer.provide(Server.HttpSettings.layer({ addr: "127.0.0.1:0" })),
    Layer.provideMerge(services),
  )
  const logger = Log.layerCollect(lines)
  const exit = await Effect.runPromiseExit(Layer.buildWithScope(layer, scope).pipe(Effect.provide(logger)))
  if (Exit.isFailure(exit)) {
    await Effect.runPromise(Scope.close(scope, exit))
    throw new Error(`gateway did not start: ${String(exit.cause)}`)
  }
  const context = exit.value as Ctx.Context<never>
  return {
    url: Context.get(exit.value, Server.Server).url,
    accounts: Context.get(exit.value as Ctx.Context<Accounts>, Accounts),
    lines,
    run: <A, E, R>(fx: Effect.Effect<A, E, R>) =>
      Effect.runPromise(
        (fx as Effect.Effect<A, E, never>).pipe(Effect.provide(context), Effect.provide(logger)),
      ),
    close: () => Effect.runPromise(Scope.close(scope, Exit.void)),
  }
}

// biome-ignore lint/suspicious/noExplicitAny: response bodies are inspected loosely
export type Json = any

/** Calls the gateway with a JSON body (or none); answers status and parsed body. */
export const call = async (
  gw: { readonly url: string },
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: unknown,
): Promise<{ status: number; body: Json }> => {
  const res = await fetch(`${gw.url}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  return { status: res.status, body: text === "" ? undefined : JSON.parse(text) }
}

/**
 * Builds `services` over its own NATS connection and the storage under `prefix`, for routes served
 * by a gateway that does not provide them (the authorization matrix); `provide` gives each route's
 * handler those services.
 */
export const routeServices = async (
  // biome-ignore lint/suspicious/noExplicitAny: the groups' services, built over NATS, storage and accounts
  services: Layer.Layer<any, any, any>,
  options: { readonly natsUrl: string; readonly prefix: string },
) => {
  const scope = Effect.runSync(Scope.make())
  const layer = (services as unknown as Layer.Layer<never, never, Accounts>).pipe(
    Layer.provideMerge(AccountsStore.layer),
    Layer.provideMerge(Storage.layerPrefix(options.prefix)),
    Layer.provideMerge(Nats.layerUrl(options.natsUrl, "hangar-test-services")),
  )
  const context = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  return {
    // biome-ignore lint/suspicious/noExplicitAny: route groups differ in requirements
    provide: <T extends Route<any>>(routes: ReadonlyArray<T>): Array<T> =>
      routes.map((r) => ({ ...r, handler: (request) => Effect.provide(r.handler(request), context) })),
    close: () => Effect.runPromise(Scope.close(scope, Exit.void)),
  }
}
