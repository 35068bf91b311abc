/**
 * What every role process stands on: its NATS connection and the storage map, ensured at start
 * (idempotent, so any number of processes may start at once). Settings come from `HANGAR_*`.
 */
import { Layer } from "effect"
import * as Nats from "./Nats.ts"
import * as Storage from "./Storage.ts"

/** The connection and the ensured storage, from the environment. */
export const layerFromEnv: Layer.Layer<Nats.Nats | Storage.Storage, Nats.NatsError> = Storage.layer.pipe(
  Layer.provideMerge(Nats.layer),
  Layer.provide(Nats.NatsSettings.layerFromEnv),
  Layer.provide(Storage.StorageSettings.layerFromEnv),
)

/** The connection to `url` and the ensured storage (the one-process mode's local server). */
export const layerUrl = (url: string): Layer.Layer<Nats.Nats | Storage.Storage, Nats.NatsError> =>
  Storage.layer.pipe(
    Layer.provideMerge(Nats.layerUrl(url)),
    Layer.provide(Storage.StorageSettings.layerFromEnv),
  )
