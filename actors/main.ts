/**
 * The actors role: an actor worker hosting the run, account and scheduler actors. It connects and
 * holds until interrupted; actor types join as their issues land (today: account).
 */
import { Effect, Layer } from "effect"
import * as Keyring from "../core/Keyring.ts"
import * as MasterKey from "../core/MasterKey.ts"
import type { Nats } from "../core/Nats.ts"
import * as Seal from "../core/Seal.ts"
import { Storage } from "../core/Storage.ts"
import * as WrappedKeyStore from "../core/WrappedKeyStore.ts"
import * as AccountActor from "./account/Account.ts"
import { ActorSettings } from "./runtime/Settings.ts"
import * as Worker from "./runtime/Worker.ts"

// The account actor seals webhook private keys under the account's data key, wrapped by the same
// master key and kept in the same `secrets` bucket as the gateway's secrets.
const wrappedKeys = Layer.unwrapEffect(
  Effect.map(Storage, ({ names }) => WrappedKeyStore.layerKv(names.kv.secrets.name)),
)
const sealLayer = Seal.layer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layer, wrappedKeys)),
  Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
)

/** The worker with its actor types; needs the process's NATS connection and storage. */
export const layer = AccountActor.actorLayer((account) => Worker.layer([account])).pipe(
  Layer.tap(() => Effect.logInfo("actor worker ready").pipe(Effect.annotateLogs({ role: "actors" }))),
  Layer.provide(sealLayer),
  Layer.provide(ActorSettings.layerFromEnv),
) satisfies Layer.Layer<Worker.Worker, unknown, Nats | Storage>
