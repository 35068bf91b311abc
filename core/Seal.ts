/**
 * Sealed small values (secrets in KV, model keys): AES-256-GCM under a key derived from the
 * account's data key, a random 12-byte nonce per value, and associated data binding the account
 * and the caller's purpose/object id (e.g. `secret:sec_…`), so a sealed value moved to another
 * account, another secret or another purpose does not open.
 *
 * Layout: `version (1) | nonce (12) | ciphertext | tag (16)` (see `Aead.ts`). Random nonces are
 * safe here because each account seals few values; large objects use `SealStream` instead.
 */
import { createSecretKey, hkdfSync, type KeyObject } from "node:crypto"
import { Context, Effect, Layer } from "effect"
import { DecryptFailed, KEY_BYTES, lengthPrefixed, openValue, sealValue } from "./Aead.ts"
import { Keyring, type KeyringError } from "./Keyring.ts"

export { DecryptFailed } from "./Aead.ts"

/** What sealing offers. */
export interface SealService {
  /** Encrypts `plaintext` for `account`, bound to `aad`; two seals of the same value differ. */
  readonly seal: (
    account: string,
    aad: string,
    plaintext: Uint8Array,
  ) => Effect.Effect<Uint8Array, KeyringError>
  /**
   * Decrypts what `seal` made for the same `account` and `aad`. Anything else (altered bytes,
   * another account, another aad, garbage) fails with `DecryptFailed`, which never carries the
   * plaintext.
   */
  readonly open: (
    account: string,
    aad: string,
    sealed: Uint8Array,
  ) => Effect.Effect<Uint8Array, KeyringError | DecryptFailed>
}

/** The seal service. */
export class Seal extends Context.Tag("hangar/Seal")<Seal, SealService>() {}

// A subkey for values, so the data key itself is never used directly by two constructions.
const valueKey = (dataKey: KeyObject): KeyObject => {
  const bytes = Buffer.from(hkdfSync("sha256", dataKey, Buffer.alloc(0), "hangar/seal/v1", KEY_BYTES))
  const key = createSecretKey(bytes)
  bytes.fill(0)
  return key
}

const aadOf = (account: string, aad: string) => lengthPrefixed("hangar/seal", account, aad)

/** Builds the seal service over the keyring. */
export const make = Effect.gen(function* () {
  const keyring = yield* Keyring
  return {
    seal: (account, aad, plaintext) =>
      keyring
        .dataKey(account)
        .pipe(Effect.map((dataKey) => sealValue(valueKey(dataKey), aadOf(account, aad), plaintext))),
    open: (account, aad, sealed) =>
      keyring.dataKey(account).pipe(
        Effect.flatMap((dataKey) => {
          const opened = openValue(valueKey(dataKey), aadOf(account, aad), sealed, "sealed value")
          return opened instanceof DecryptFailed ? Effect.fail(opened) : Effect.succeed(opened)
        }),
      ),
  } satisfies SealService
})

/** The seal service as a layer; needs `Keyring`. */
export const layer = Layer.effect(Seal, make)
