/**
 * Test helpers: an account-actor worker over a real nats-server, with its own connection, storage
 * under `prefix`, and a seal whose master key and wrapped data keys live in memory.
 */
import { Context, Effect, Exit, Layer, Scope } from "effect"
import type { ActorSettingsShape } from "../../core/actors/Settings.ts"
import { startWorker } from "../../core/actors/testing/Harness.ts"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import { Nats, layerUrl as natsLayerUrl } from "../../core/Nats.ts"
import * as Seal from "../../core/Seal.ts"
import { Storage, layerPrefix as storageLayerPrefix } from "../../core/Storage.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import * as AccountActor from "./Account.ts"

/** A seal with an in-memory master key and data keys (one build = one key set). */
export const sealLayerMemory: Layer.Layer<Seal.Seal> = Seal.layer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
)

/** A running account worker; `seal` opens what it sealed. */
export interface AccountWorker {
  readonly seal: Seal.SealService
  readonly stop: Effect.Effect<void>
}

/** Starts an account-actor worker for storage `prefix` on the nats-server at `url`. */
export const startAccountWorker = (url: string, prefix: string, settings: Partial<ActorSettingsShape> = {}) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const deps = sealLayerMemory.pipe(
      Layer.provideMerge(storageLayerPrefix(prefix)),
      Layer.provideMerge(natsLayerUrl(url, "test-account-actor")),
    )
    const context = yield* Layer.buildWithScope(deps, scope).pipe(Effect.orDie)
    const seal = Context.get(context, Seal.Seal)
    const actor = AccountActor.make({
      nats: Context.get(context, Nats),
      storage: Context.get(context, Storage),
      seal,
    })
    const worker = yield* startWorker(url, prefix, [actor], settings)
    return {
      seal,
      stop: worker.stop.pipe(Effect.zipRight(Scope.close(scope, Exit.void))),
    } satisfies AccountWorker
  })
