/**
 * The one-process mode of `npm start` (`hangar serve all`): the local nats-server (which holds the
 * data folder's lock), the storage map, and every role on one connection. Closing the scope stops
 * the roles first, then drains the connection, then stops nats-server and releases the lock.
 */
import { Effect, Layer } from "effect"
import * as Actors from "../actors/main.ts"
import * as Connected from "../core/Connected.ts"
import * as Gateway from "../gateway/main.ts"
import * as HostAgent from "../host-agent/main.ts"
import * as Relay from "../relay/main.ts"
import * as LocalNats from "./LocalNats.ts"

/** Every role of the service, on the connection and storage they are given. */
export const roles = Layer.mergeAll(Gateway.layer, Relay.layer, Actors.layer, HostAgent.layer)

/** The whole service on a local nats-server, settings from `HANGAR_*`. */
export const layer = Layer.unwrapScoped(
  Effect.gen(function* () {
    const server = yield* LocalNats.LocalNats
    return roles.pipe(Layer.provide(Connected.layerUrl(server.url)))
  }),
).pipe(
  Layer.tap(() => Effect.logInfo("hangar is up (Ctrl-C stops it)")),
  Layer.provide(LocalNats.layer),
  Layer.provide(LocalNats.LocalNatsSettings.layerFromEnv),
)
