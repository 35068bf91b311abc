/**
 * Where wrapped data keys are kept, one per account: a port of the `Keyring`. The in-memory layer
 * serves tests and throwaway stacks; the KV layer (bucket `secrets`, key `datakey.<account>`) is
 * the real one. Values are opaque bytes already encrypted by the master key.
 */
import { Context, Data, Effect, Layer, Option, Schema } from "effect"
import { kvKeys, storageNames } from "../schema/Subjects.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"

/** The store could not be read or written (the bus is down, the bucket is missing). Retryable. */
export class KeyStoreFailed extends Data.TaggedError("KeyStoreFailed")<{
  readonly account: string
  readonly reason: string
  readonly cause?: unknown
}> {
  override get message() {
    return this.reason
  }
}

/** Wrapped data keys by account id. */
export interface WrappedKeyStoreService {
  /** The wrapped data key stored for `account`, if any. */
  readonly get: (account: string) => Effect.Effect<Option.Option<Uint8Array>, KeyStoreFailed>
  /**
   * Stores `wrapped` for `account` only if nothing is stored yet (compare-and-set against absence):
   * `true` when this call stored it, `false` when another writer was first, in which case the
   * caller re-reads and uses that one. A stored key is never overwritten.
   */
  readonly create: (account: string, wrapped: Uint8Array) => Effect.Effect<boolean, KeyStoreFailed>
}

/** The wrapped data key store. */
export class WrappedKeyStore extends Context.Tag("hangar/WrappedKeyStore")<
  WrappedKeyStore,
  WrappedKeyStoreService
>() {}

/** A store in a `Map` (per layer build): tests and embedded single-process use. */
export const makeMemory = (): WrappedKeyStoreService => {
  const keys = new Map<string, Uint8Array>()
  return {
    get: (account) => Effect.sync(() => Option.fromNullable(keys.get(account))),
    create: (account, wrapped) =>
      Effect.sync(() => {
        if (keys.has(account)) return false
        keys.set(account, Uint8Array.from(wrapped))
        return true
      }),
  }
}

/** The in-memory store as a layer. */
export const layerMemory: Layer.Layer<WrappedKeyStore> = Layer.sync(WrappedKeyStore, makeMemory)

/** The stored JSON value: the wrapped key in base64. */
const StoredKey = Schema.Struct({ wrapped: Schema.Uint8ArrayFromBase64 })

const validAccount = (account: string) => /^[A-Za-z0-9_-]+$/.test(account)

/**
 * A store in a KV bucket (default: `secrets`), key `datakey.<account>`. `create` is the bucket's
 * create (compare-and-set against absence), so concurrent creators in any process agree.
 */
export const makeKv = (
  bucket: string = storageNames().kv.secrets.name,
): Effect.Effect<WrappedKeyStoreService, NatsError, Nats> =>
  Effect.gen(function* () {
    const kv = yield* Kv.make(bucket, StoredKey)
    const failed = (account: string, what: string) => (cause: { readonly message: string }) =>
      new KeyStoreFailed({ account, reason: `${what} ${bucket}: ${cause.message}`, cause })
    const checked = <A>(account: string, f: () => Effect.Effect<A, KeyStoreFailed>) =>
      validAccount(account)
        ? f()
        : Effect.fail(new KeyStoreFailed({ account, reason: "account id is not a valid KV key token" }))
    return {
      get: (account) =>
        checked(account, () =>
          kv
            .get(kvKeys.dataKey(account))
            .pipe(
              Effect.map(Option.map((entry) => entry.value.wrapped)),
              Effect.mapError(failed(account, "get")),
            ),
        ),
      create: (account, wrapped) =>
        checked(account, () =>
          kv.create(kvKeys.dataKey(account), { wrapped }).pipe(
            Effect.as(true),
            Effect.catchTag("StateConflict", () => Effect.succeed(false)),
            Effect.mapError(failed(account, "create")),
          ),
        ),
    }
  })

/** The KV store as a layer (needs `Nats`; the bucket must exist). */
export const layerKv = (bucket?: string) => Layer.effect(WrappedKeyStore, makeKv(bucket))

/** The KV store in this process's storage (its `secrets` bucket, prefixed in tests). */
export const layerStorage: Layer.Layer<WrappedKeyStore, NatsError, Nats | Storage> = Layer.unwrapEffect(
  Effect.map(Storage, ({ names }) => layerKv(names.kv.secrets.name)),
)
