/**
 * The master key: the key-encryption key that wraps every account's data key (envelope
 * encryption, DESIGN.md "Storage map"). Callers only `wrap` and `unwrap`, never see the key, so a
 * KMS can replace the local implementation in production without touching them.
 *
 * Local mode reads 32 bytes from `HANGAR_MASTER_KEY` (base64) when set, else from a file (default
 * `.data/master.key`, `HANGAR_MASTER_KEY_FILE`). The file is created on first start, mode 0600,
 * atomically: the key is written and fsynced under a temporary name and then hard-linked to the
 * final name, which fails if the name exists, so processes starting at the same time all end up
 * reading the one file that won. A key of the wrong length is refused rather than padded or cut.
 * The key lives only in a `KeyObject` (native memory, prints as `SecretKeyObject`), never in a log.
 */
import { createSecretKey, type KeyObject, randomBytes } from "node:crypto"
import { stat } from "node:fs/promises"
import { join } from "node:path"
import { Context, Data, Effect, Layer, Redacted } from "effect"
import { type DecryptFailed, KEY_BYTES, lengthPrefixed, openValue, sealValue } from "./Aead.ts"
import { defineSettings, env } from "./Config.ts"
import { dataDir } from "./DataDir.ts"
import { readOrCreate } from "./SecretFile.ts"

/** The master key's source holds no usable key (wrong length, bad encoding); the process must not start. */
export class MasterKeyInvalid extends Data.TaggedError("MasterKeyInvalid")<{
  readonly source: string
  readonly reason: string
}> {
  override get message() {
    return `master key from ${this.source} refused: ${this.reason}`
  }
}

/** The master key could not be reached (file system error; a KMS outage later). Retryable. */
export class MasterKeyUnavailable extends Data.TaggedError("MasterKeyUnavailable")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

/** What the rest of the system may do with the master key. */
export interface MasterKeyService {
  /** Encrypts a data key, binding `aad` (e.g. the account it belongs to); each call uses a fresh nonce. */
  readonly wrap: (dataKey: Uint8Array, aad: string) => Effect.Effect<Uint8Array, MasterKeyUnavailable>
  /** Decrypts what `wrap` made with the same `aad`; any mismatch or alteration is `DecryptFailed`. */
  readonly unwrap: (
    wrapped: Uint8Array,
    aad: string,
  ) => Effect.Effect<Uint8Array, DecryptFailed | MasterKeyUnavailable>
}

/** The master key service. */
export class MasterKey extends Context.Tag("hangar/MasterKey")<MasterKey, MasterKeyService>() {}

/**
 * `file`: where the local key lives (`HANGAR_MASTER_KEY_FILE`); `key`: base64 of 32 bytes
 * (`HANGAR_MASTER_KEY`), which wins over the file when non-empty.
 */
export const MasterKeySettings = defineSettings(
  "hangar/MasterKeySettings",
  { file: join(dataDir, "master.key"), key: Redacted.make("") },
  (d) => ({ file: env.string("MASTER_KEY_FILE", d.file), key: env.redacted("MASTER_KEY", "") }),
)

// Domain separation: a value wrapped here can never be confused with a Seal of the same bytes.
const aadOf = (aad: string) => lengthPrefixed("hangar/masterkey", aad)

/** A master key service over a key already in hand (tests, and the env form). */
export const fromKey = (key: KeyObject): MasterKeyService => ({
  wrap: (dataKey, aad) => Effect.sync(() => sealValue(key, aadOf(aad), dataKey)),
  unwrap: (wrapped, aad) =>
    Effect.suspend(() => {
      const opened = openValue(key, aadOf(aad), wrapped, "wrapped data key")
      return opened instanceof Uint8Array ? Effect.succeed(opened) : Effect.fail(opened)
    }),
})

const toKey = (bytes: Uint8Array, source: string): Effect.Effect<KeyObject, MasterKeyInvalid> =>
  Effect.suspend(() => {
    if (bytes.byteLength !== KEY_BYTES) {
      return Effect.fail(
        new MasterKeyInvalid({ source, reason: `expected ${KEY_BYTES} bytes, found ${bytes.byteLength}` }),
      )
    }
    const key = createSecretKey(bytes)
    bytes.fill(0)
    return Effect.succeed(key)
  })

/**
 * Loads the key file, creating it (0600, atomically) when absent; a file of the wrong length is
 * `MasterKeyInvalid`. A file readable by group or others is used but warned about.
 */
export const loadFile = (file: string): Effect.Effect<KeyObject, MasterKeyInvalid | MasterKeyUnavailable> =>
  Effect.gen(function* () {
    const bytes = yield* Effect.tryPromise({
      try: () => readOrCreate(file, () => randomBytes(KEY_BYTES)),
      catch: (cause) => new MasterKeyUnavailable({ reason: `cannot read or create ${file}`, cause }),
    })
    const key = yield* toKey(bytes, file)
    const mode = yield* Effect.promise(() => stat(file).then((s) => s.mode))
    if ((mode & 0o077) !== 0) {
      yield* Effect.logWarning("master key file is readable by others; chmod 600 it").pipe(
        Effect.annotateLogs({ file, mode: (mode & 0o777).toString(8) }),
      )
    }
    return key
  })

/** Builds the local master key from the settings (env key first, else the file). */
export const make = Effect.gen(function* () {
  const settings = yield* MasterKeySettings.Tag
  const fromEnv = Redacted.value(settings.key)
  const key =
    fromEnv.length > 0
      ? yield* toKey(Buffer.from(fromEnv, "base64"), "HANGAR_MASTER_KEY")
      : yield* loadFile(settings.file)
  return fromKey(key)
})

/** The local master key as a layer; fails (the process refuses to start) when the key is invalid. */
export const layer = Layer.effect(MasterKey, make)

/**
 * A master key held only in memory: the given key, or one random key drawn when `layerMemory()` is
 * called (so every build of that layer value has the same key). Tests and throwaway stacks.
 */
export const layerMemory = (key: Uint8Array = randomBytes(KEY_BYTES)): Layer.Layer<MasterKey> =>
  Layer.sync(MasterKey, () => fromKey(createSecretKey(key)))
