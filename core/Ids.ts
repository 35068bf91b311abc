/**
 * Prefixed, time-ordered identifiers: `<prefix>_<26 characters>`, the characters being a
 * 48-bit millisecond timestamp and 80 random bits in lowercase Crockford base32 (ULID layout).
 * Ids made later sort after ids made earlier, as strings; within one millisecond in one process
 * the random part is incremented, so order holds there too.
 */
import { createHash, randomFillSync } from "node:crypto"

const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

/** The prefixes in use; each matches the id pattern of the same kind in `schema/Ids.ts`. */
export type IdPrefix =
  | "acc"
  | "usr"
  | "key"
  | "fnc"
  | "run"
  | "cmd"
  | "file"
  | "prv"
  | "sec"
  | "evt"
  | "img"
  | "login"
  | "led"
  | "wrk"
  | "host"

let lastTime = -1
let lastRandom: Uint8Array = new Uint8Array(10)

const increment = (bytes: Uint8Array): Uint8Array => {
  const next = Uint8Array.from(bytes)
  for (let i = next.length - 1; i >= 0; i--) {
    if (next[i]! < 255) {
      next[i]! += 1
      return next
    }
    next[i] = 0
  }
  return next
}

const encode = (time: number, random: Uint8Array): string => {
  let out = ""
  let t = time
  for (let i = 0; i < 10; i++) {
    out = alphabet[t % 32] + out
    t = Math.floor(t / 32)
  }
  // 80 random bits = 16 characters of 5 bits, the first from the top bits of the first byte: the
  // 5 bits at bit offset 5i of the big-endian number, read from the two bytes that hold them.
  for (let i = 0; i < 16; i++) {
    const at = i * 5
    const byte = at >> 3
    const pair = (random[byte]! << 8) | (byte + 1 < 10 ? random[byte + 1]! : 0)
    out += alphabet[(pair >> (11 - (at & 7))) & 31]
  }
  return out
}

// Random bytes are drawn from the CSPRNG a pool at a time (as node's randomUUID does): one
// randomBytes call per id cost more than the rest of making it.
const POOL_IDS = 128
const pool = Buffer.alloc(10 * POOL_IDS)
let pooled = POOL_IDS
const freshRandom = (): Uint8Array => {
  if (pooled === POOL_IDS) {
    randomFillSync(pool)
    pooled = 0
  }
  const at = 10 * pooled++
  return Uint8Array.prototype.slice.call(pool, at, at + 10)
}

/** A new id with the given prefix, taking its time from `now` (milliseconds since the epoch). */
export const makeId = <P extends IdPrefix>(prefix: P, now: number = Date.now()): `${P}_${string}` => {
  if (now <= lastTime) {
    lastRandom = increment(lastRandom)
  } else {
    lastTime = now
    lastRandom = freshRandom()
  }
  return `${prefix}_${encode(Math.max(now, lastTime), lastRandom)}`
}

/**
 * A time-ordered id made at `now` whose random part comes from `seed` (SHA-256): the same seed and
 * time always give the same id, and it sorts among ids made around `now` (an idempotent request
 * retried later makes the id its first attempt made).
 */
export const seededId = <P extends IdPrefix>(prefix: P, now: number, seed: string): `${P}_${string}` =>
  `${prefix}_${encode(now, createHash("sha256").update(`${prefix}:${seed}`).digest().subarray(0, 10))}`

/** The millisecond timestamp an id was made at. */
export const idTime = (id: string): number => {
  const body = id.slice(id.indexOf("_") + 1, id.indexOf("_") + 11)
  let t = 0
  for (const c of body) t = t * 32 + alphabet.indexOf(c)
  return t
}

/**
 * A deterministic id of the given kind derived from `seed` (SHA-256, first 130 bits in the id
 * alphabet): the same seed always gives the same id, so a message retried after a crash carries
 * the same ledger entry or event id (`derivedId("led", "<run>:3-3")`). Such ids are not time-ordered.
 */
export const derivedId = <P extends IdPrefix>(prefix: P, seed: string): `${P}_${string}` => {
  const digest = createHash("sha256").update(`${prefix}:${seed}`).digest()
  let bits = 0n
  for (const b of digest.subarray(0, 17)) bits = (bits << 8n) | BigInt(b)
  let out = ""
  for (let i = 0; i < 26; i++) {
    out = alphabet[Number(bits & 31n)] + out
    bits >>= 5n
  }
  return `${prefix}_${out}`
}
