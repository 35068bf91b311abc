/**
 * What every role process stands on: its NATS connection and the storage map, ensured at start
 * (idempotent, so any number of processes may start at once). Settings come from `HANGAR_*`.
 */
import { Effect, Layer } from "effect"
import * as Nats from "./Nats.ts"
import * as Storage from "./Storage.ts"

const onSettings = (settings: Layer.Layer<typeof Nats.NatsSettings.Tag.Identifier>) =>
  Storage.layer.pipe(
    Layer.provideMerge(Nats.layer),
    Layer.provide(settings),
    Layer.provide(Storage.StorageSettings.layerFromEnv),
  )

/** The connection and the ensured storage, from the environment (a command: no server fails at once). */
export const layerFromEnv: Layer.Layer<Nats.Nats | Storage.Storage, Nats.NatsError> = onSettings(
  Nats.NatsSettings.layerFromEnv,
)

/**
 * As `layerFromEnv`, for a role (`hangar serve`): one started while no NATS server answers says so
 * and waits for one (`NatsSettings.waitForServers`) instead of exiting; refused credentials still
 * end it at once.
 */
export const roleLayerFromEnv: Layer.Layer<Nats.Nats | Storage.Storage, Nats.NatsError> = onSettings(
  Layer.effect(
    Nats.NatsSettings.Tag,
    Effect.map(Nats.NatsSettings.Tag, (s) => ({ ...s, waitForServers: true })),
  ).pipe(Layer.provide(Nats.NatsSettings.layerFromEnv)),
)

/** The connection to `url` and the ensured storage (the one-process mode's local server). */
export const layerUrl = (url: string): Layer.Layer<Nats.Nats | Storage.Storage, Nats.NatsError> =>
  Storage.layer.pipe(
    Layer.provideMerge(Nats.layerUrl(url)),
    Layer.provide(Storage.StorageSettings.layerFromEnv),
  )
