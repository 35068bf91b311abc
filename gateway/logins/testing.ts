/**
 * Test helpers for the login and credit groups: the shared test gateway (its `services` option
 * carries the group's services) and a JSON call helper.
 */
import { Effect, Exit, Layer, Scope } from "effect"
import type { Accounts } from "../../core/Accounts.ts"
import * as AccountsStore from "../../core/Accounts.ts"
import * as Nats from "../../core/Nats.ts"
import * as Storage from "../../core/Storage.ts"
import type { Route } from "../Router.ts"

/** The shared test gateway: routes, the auth step, the account store and `services`. */
export { startGateway, type TestGateway } from "../auth/testing.ts"

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
