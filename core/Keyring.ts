/**
 * Per-account data keys (envelope encryption): `dataKey(account)` gives the account's 32-byte
 * AES key, creating it on first use, storing it only wrapped by the master key, and keeping the
 * unwrapped key in memory afterwards. The wrap binds the account id as associated data, so a
 * wrapped key copied into another account's slot does not unwrap.
 *
 * Two callers (fibers or processes) asking for a new account at once both generate a key, but the
 * store's create-if-absent lets only one be stored; the loser re-reads and uses the winner's, so
 * every caller ends with the same key.
 */
import { createSecretKey, type KeyObject, randomBytes } from "node:crypto"
import { Context, Effect, Layer, Option } from "effect"
import { type DecryptFailed, KEY_BYTES } from "./Aead.ts"
import { MasterKey, type MasterKeyUnavailable } from "./MasterKey.ts"
import { KeyStoreFailed, WrappedKeyStore } from "./WrappedKeyStore.ts"

/** Why a data key could not be had: the store failed, the master key is unreachable, or it does not open the stored key. */
export type KeyringError = KeyStoreFailed | MasterKeyUnavailable | DecryptFailed

/** What the keyring offers. */
export interface KeyringService {
  /**
   * The account's data key as a secret `KeyObject` (never printable); the same key on every call
   * and in every process. Created and stored on first use; cached after the first success.
   */
  readonly dataKey: (account: string) => Effect.Effect<KeyObject, KeyringError>
}

/** The keyring service. */
export class Keyring extends Context.Tag("hangar/Keyring")<Keyring, KeyringService>() {}

const aadOf = (account: string) => `datakey:${account}`

/** Builds the keyring over the master key and the wrapped key store. */
export const make = Effect.gen(function* () {
  const master = yield* MasterKey
  const store = yield* WrappedKeyStore
  // Unbounded on purpose: one 32-byte key per account active in this process.
  const cache = new Map<string, KeyObject>()

  const unwrap = (account: string, wrapped: Uint8Array) =>
    master.unwrap(wrapped, aadOf(account)).pipe(
      Effect.map((bytes) => {
        const key = createSecretKey(bytes)
        bytes.fill(0)
        return key
      }),
    )

  const load = (account: string): Effect.Effect<KeyObject, KeyringError> =>
    Effect.gen(function* () {
      const stored = yield* store.get(account)
      if (Option.isSome(stored)) return yield* unwrap(account, stored.value)
      const fresh = randomBytes(KEY_BYTES)
      const key = createSecretKey(fresh)
      const wrapped = yield* master.wrap(fresh, aadOf(account))
      fresh.fill(0)
      if (yield* store.create(account, wrapped)) {
        yield* Effect.logInfo("data key created").pipe(Effect.annotateLogs({ account }))
        return key
      }
      // Another writer stored its key first: use that one.
      const winner = yield* store.get(account)
      if (Option.isNone(winner)) {
        return yield* new KeyStoreFailed({ account, reason: "create reported a key that cannot be read" })
      }
      return yield* unwrap(account, winner.value)
    })

  const dataKey = (account: string) =>
    Effect.suspend(() => {
      const hit = cache.get(account)
      if (hit !== undefined) return Effect.succeed(hit)
      return load(account).pipe(Effect.tap((key) => Effect.sync(() => cache.set(account, key))))
    })

  return { dataKey } satisfies KeyringService
})

/** The keyring as a layer; needs `MasterKey` and `WrappedKeyStore`. */
export const layer = Layer.effect(Keyring, make)
