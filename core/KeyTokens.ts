/**
 * Account key tokens: `hgr_` and 32 random bytes in base64url (43 characters). Only the SHA-256
 * (hex) of the whole token is stored; the token itself is shown once, at creation.
 */
import { createHash, randomBytes } from "node:crypto"

/** The prefix every key token starts with. */
export const tokenPrefix = "hgr_"

const shape = /^hgr_[A-Za-z0-9_-]{43}$/

/** A fresh token. */
export const newToken = (): string => `${tokenPrefix}${randomBytes(32).toString("base64url")}`

/** Whether `token` has the shape of a key token (cheap check before any lookup). */
export const isKeyToken = (token: string): boolean => shape.test(token)

// The last token hashed and its hash: a request's token is hashed by the rate limit and again by
// the auth step, in the same uWS callback. Only the last one is held.
let lastToken = ""
let lastHash = ""

/** The stored form of a token: SHA-256, lower-case hex. */
export const hashToken = (token: string): string => {
  if (token !== lastToken || lastToken === "") {
    lastHash = createHash("sha256").update(token).digest("hex")
    lastToken = token
  }
  return lastHash
}

/**
 * Compares two hashes in time that does not depend on where they differ (different lengths are
 * unequal). On the strings themselves: two buffers made for `timingSafeEqual` cost a request more
 * than the rest of its key check.
 */
export const sameHash = (a: string, b: string): boolean => {
  if (a.length !== b.length) return false
  let diff = 0
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i)
  return diff === 0
}
