/**
 * The actors role: an actor worker hosting the run, account and scheduler actors. It connects and
 * holds until interrupted; actor types join as their issues land.
 */
import { Effect, Layer } from "effect"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"

/** The worker's layers; needs the process's NATS connection and storage. */
export const layer: Layer.Layer<never, never, Nats | Storage> = Layer.effectDiscard(
  Effect.logInfo("actor worker ready").pipe(Effect.annotateLogs({ role: "actors" })),
)
