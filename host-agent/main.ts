/**
 * The host-agent role: the host registers its driver, budget and bases in KV `hosts`, beats every
 * few seconds, reflects its capacity (machines held, vCPUs and memory free) into that record, and
 * removes it on shutdown. Creating machines on request comes with the host actor, which will use
 * the `Capacity` and `MachineDriver` services composed here.
 */
import { Layer } from "effect"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"
import { BasesSettings } from "./bases/Bases.ts"
import * as Capacity from "./registry/Capacity.ts"
import { HostSettings, layerHost } from "./registry/HostSettings.ts"
import * as Registration from "./registry/Registration.ts"

const host = layerHost.pipe(Layer.provide(HostSettings.layerFromEnv))

/**
 * The host agent's layers; needs the process's NATS connection and storage. A malformed
 * `HANGAR_HOST_ID` or a first registration the bus refuses stops the role at start (as a malformed
 * setting does), so a host never runs unregistered.
 */
export const layer: Layer.Layer<never, never, Nats | Storage> = Layer.discard(Registration.layer).pipe(
  Layer.provide(Capacity.layer),
  Layer.provide(Layer.mergeAll(host, HostSettings.layerFromEnv, BasesSettings.layerFromEnv)),
  Layer.orDie,
)
