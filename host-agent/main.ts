/**
 * The host-agent role: registration, capacity and machines. The machine drivers and guest
 * sessions exist (`machines/`, `guest/`); registration with the scheduler comes with the host
 * actor. Until then the role connects and holds until interrupted.
 */
import { Effect, Layer } from "effect"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"

/** The host agent's layers; needs the process's NATS connection and storage. */
export const layer: Layer.Layer<never, never, Nats | Storage> = Layer.effectDiscard(
  Effect.logInfo("host agent ready (registration comes with the host actor)").pipe(
    Effect.annotateLogs({ role: "host-agent" }),
  ),
)
