/**
 * Test helpers for route groups behind the auth step: a gateway on port 0 over a real nats-server
 * (storage under the given prefix, local issuer key in the given file), and ID tokens minted by
 * that issuer.
 */
import { Context, Effect, Exit, Layer, Logger, Scope } from "effect"
import { Accounts, type AccountsService } from "../../core/Accounts.ts"
import { IssuerSettings, loadKey, mint } from "../../core/LocalIssuer.ts"
import * as Log from "../../core/Log.ts"
import * as Nats from "../../core/Nats.ts"
import * as Storage from "../../core/Storage.ts"
import * as RateLimit from "../RateLimit.ts"
import type { Route } from "../Router.ts"
import * as Server from "../Server.ts"
import * as Auth from "./Auth.ts"

/** A running test gateway. */
export interface TestGateway {
  readonly url: string
  readonly accounts: AccountsService
  readonly lines: Array<string>
  /** Runs an effect with the gateway's services (stores, NATS, storage, the groups' services). */
  readonly run: <A, E, R>(fx: Effect.Effect<A, E, R>) => Promise<A>
  readonly close: () => Promise<void>
}

/**
 * Starts a gateway serving `routes` on a free port, with the auth step and the account store over
 * the given nats-server and storage prefix; `services` adds a route group's own services (a layer
 * over NATS, storage and the account store). `close` stops it and its NATS connection.
 */
export const startGateway = async (
  // biome-ignore lint/suspicious/noExplicitAny: route groups differ in requirements, all provided here
  routes: ReadonlyArray<Route<any>>,
  options: {
    readonly natsUrl: string
    readonly prefix: string
    readonly keyFile: string
    readonly issuer?: Partial<typeof IssuerSettings.defaults>
    // biome-ignore lint/suspicious/noExplicitAny: a group's services, built over NATS, storage and accounts
    readonly services?: Layer.Layer<any, any, any>
    /** Render log lines and drop them instead of collecting them (benchmarks). */
    readonly discardLogs?: boolean
  },
): Promise<TestGateway> => {
  const lines: Array<string> = []
  const scope = Effect.runSync(Scope.make())
  const base = Auth.layerAll.pipe(
    Layer.provide(IssuerSettings.layer({ keyFile: options.keyFile, ...options.issuer })),
    Layer.provideMerge(Storage.layerPrefix(options.prefix)),
    Layer.provideMerge(Nats.layerUrl(options.natsUrl, "hangar-test-gateway")),
  )
  const services =
    options.services === undefined
      ? base
      : (options.services as unknown as Layer.Layer<never, never, Auth.Auth | Accounts>).pipe(
          Layer.provideMerge(base),
        )
  // Every requirement of the routes is in `services`.
  const layer = Server.layer(routes as ReadonlyArray<Route<never>>).pipe(
    Layer.provide(RateLimit.layer),
    Layer.provide(RateLimit.RateLimitSettings.layer({ perSecond: 1_000_000, burst: 1_000_000 })),
    Layer.provide(Server.HttpSettings.layer({ addr: "127.0.0.1:0" })),
    Layer.provideMerge(services),
  )
  const logger = options.discardLogs
    ? Logger.replace(
        Logger.defaultLogger,
        Log.jsonLogger(() => {}),
      )
    : Log.layerCollect(lines)
  const exit = await Effect.runPromiseExit(Layer.buildWithScope(layer, scope).pipe(Effect.provide(logger)))
  if (Exit.isFailure(exit)) {
    await Effect.runPromise(Scope.close(scope, exit))
    throw new Error(`gateway did not start: ${String(exit.cause)}`)
  }
  const context = exit.value as Context.Context<never>
  return {
    url: Context.get(exit.value, Server.Server).url,
    accounts: Context.get(exit.value as Context.Context<Accounts>, Accounts),
    lines,
    run: <A, E, R>(fx: Effect.Effect<A, E, R>) =>
      Effect.runPromise(
        (fx as Effect.Effect<A, E, never>).pipe(Effect.provide(context), Effect.provide(logger)),
      ),
    close: () => Effect.runPromise(Scope.close(scope, Exit.void)),
  }
}

/** An ID token for `email` from the local issuer whose key is in `keyFile`. */
export const personToken = (
  keyFile: string,
  email: string,
  options: { readonly audience?: string; readonly ttlSeconds?: number } = {},
): Promise<string> =>
  Effect.runPromise(
    Effect.flatMap(loadKey(keyFile), (key) =>
      mint(key, {
        email,
        audience: options.audience ?? IssuerSettings.defaults.audience,
        ttlSeconds: options.ttlSeconds ?? 600,
      }),
    ),
  )

/** Runs a store effect (fixtures). */
export const run = <A>(fx: Effect.Effect<A, unknown>): Promise<A> => Effect.runPromise(fx as Effect.Effect<A>)
