/**
 * Unique names for tests sharing one nats-server: every bucket, stream and subject prefix a test
 * creates carries a fresh random token, so tests never see each other's data.
 */
import { randomBytes } from "node:crypto"

const ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"

const token = (length = 10): string => {
  const bytes = randomBytes(length)
  let out = ""
  for (const b of bytes) out += ALPHABET[b & 31]
  return out
}

/**
 * A name valid as a KV bucket, object store, stream name and a single subject token:
 * `<label>_<10 random chars>` (letters, digits, `_` and `-` only).
 */
export const uniqueName = (label = "t"): string => `${label.replace(/[^A-Za-z0-9_-]/g, "_")}_${token()}`

/** A storage prefix for `StorageNames.make(prefix)`: lowercase letters and digits, starting with `t`. */
export const uniquePrefix = (): string => `t${token(11)}`
