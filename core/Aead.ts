/**
 * The AES-256-GCM primitives shared by `MasterKey`, `Seal` and `SealStream`: the one error every
 * failed decryption becomes, the sealed-value layout, and an unambiguous encoding of associated
 * data. Not a service: plain functions over Node's `crypto`, so the services stay small.
 *
 * Sealed value layout: `version (1) | nonce (12) | ciphertext | tag (16)`. The version byte is
 * also part of the associated data, so a value cannot be replayed under another version's rules.
 */
import { createCipheriv, createDecipheriv, type KeyObject, randomBytes } from "node:crypto"
import { Data } from "effect"

/** Layout constants of AES-256-GCM as used here. */
export const KEY_BYTES = 32
export const NONCE_BYTES = 12
export const TAG_BYTES = 16
export const VERSION = 1
/** Bytes a sealed value adds to its plaintext. */
export const OVERHEAD = 1 + NONCE_BYTES + TAG_BYTES

/**
 * A ciphertext did not authenticate (wrong key, wrong account or object, altered, reordered,
 * truncated or extended bytes) or is malformed. `what` names what was being opened (never the
 * plaintext or the key); `reason` says which check failed.
 */
export class DecryptFailed extends Data.TaggedError("DecryptFailed")<{
  readonly what: string
  readonly reason: string
}> {
  override get message() {
    return `cannot decrypt ${this.what}: ${this.reason}`
  }
}

const encoder = new TextEncoder()

/**
 * Concatenates parts each preceded by its 4-byte big-endian length, so ("ab", "c") and ("a", "bc")
 * never encode alike: associated data and key-derivation info are built with it.
 */
export const lengthPrefixed = (...parts: ReadonlyArray<string | Uint8Array>): Buffer => {
  const bytes = parts.map((p) => (typeof p === "string" ? encoder.encode(p) : p))
  const out = Buffer.allocUnsafe(bytes.reduce((n, b) => n + 4 + b.byteLength, 0))
  let at = 0
  for (const b of bytes) {
    out.writeUInt32BE(b.byteLength, at)
    out.set(b, at + 4)
    at += 4 + b.byteLength
  }
  return out
}

/** Seals `plaintext` under `key` with a fresh random nonce; `aad` is authenticated, not stored. */
export const sealValue = (
  key: KeyObject | Uint8Array,
  aad: Uint8Array,
  plaintext: Uint8Array,
): Uint8Array => {
  const nonce = randomBytes(NONCE_BYTES)
  const cipher = createCipheriv("aes-256-gcm", key, nonce, { authTagLength: TAG_BYTES })
  cipher.setAAD(Buffer.concat([Buffer.of(VERSION), aad]))
  const head = cipher.update(plaintext)
  const tail = cipher.final()
  return Buffer.concat([Buffer.of(VERSION), nonce, head, tail, cipher.getAuthTag()])
}

/**
 * Opens a value made by `sealValue`. Returns the plaintext only once the tag has verified; any
 * failure (including a malformed value) is a `DecryptFailed` naming `what`, never an exception.
 */
export const openValue = (
  key: KeyObject | Uint8Array,
  aad: Uint8Array,
  sealed: Uint8Array,
  what: string,
): Uint8Array | DecryptFailed => {
  if (sealed.byteLength < OVERHEAD) return new DecryptFailed({ what, reason: "too short" })
  if (sealed[0] !== VERSION) return new DecryptFailed({ what, reason: `unknown version ${sealed[0]}` })
  try {
    const nonce = sealed.subarray(1, 1 + NONCE_BYTES)
    const body = sealed.subarray(1 + NONCE_BYTES, sealed.byteLength - TAG_BYTES)
    const decipher = createDecipheriv("aes-256-gcm", key, nonce, { authTagLength: TAG_BYTES })
    decipher.setAAD(Buffer.concat([Buffer.of(VERSION), aad]))
    decipher.setAuthTag(sealed.subarray(sealed.byteLength - TAG_BYTES))
    const head = decipher.update(body)
    const tail = decipher.final()
    return tail.byteLength === 0 ? head : Buffer.concat([head, tail])
  } catch {
    return new DecryptFailed({ what, reason: "authentication failed" })
  }
}
