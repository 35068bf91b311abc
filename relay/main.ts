/**
 * The relay role: the terminal WebSocket rendezvous (issue "terminal relay", not built yet). It
 * connects to NATS and holds until interrupted, so deployments can already run the role.
 */
import { Effect, Layer } from "effect"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"

/** The relay's layers; needs the process's NATS connection and storage. */
export const layer: Layer.Layer<never, never, Nats | Storage> = Layer.effectDiscard(
  Effect.logInfo("relay ready (terminal routes come with the relay issue)").pipe(
    Effect.annotateLogs({ role: "relay" }),
  ),
)
