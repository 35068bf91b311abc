/**
 * The relay role: the terminal WebSocket rendezvous (`Relay.ts`), listening on
 * `HANGAR_RELAY_ADDR`; callers are given `HANGAR_RELAY_URL` (or `ws://<addr>/terminal`).
 */
import { Layer } from "effect"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"
import * as Relay from "./Relay.ts"

/** The relay's layers; needs the process's NATS connection and storage. */
export const layer: Layer.Layer<never, never, Nats | Storage> = Relay.layer.pipe(Layer.orDie)
