import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import { idTime, makeId, seededId } from "./Ids.ts"

const shape = /^run_[0-9a-hjkmnp-tv-z]{26}$/

describe("makeId", () => {
  it("has the prefix and the 26-character body", () => {
    expect(makeId("run")).toMatch(shape)
    expect(makeId("file")).toMatch(/^file_[0-9a-hjkmnp-tv-z]{26}$/)
  })

  it("sorts by creation, also within one millisecond", () => {
    const ids = Array.from({ length: 5000 }, () => makeId("cmd"))
    expect([...ids].sort()).toEqual(ids)
    expect(new Set(ids).size).toBe(ids.length)
  })

  it("sorts by the time it was made, across times", () => {
    const earlier = makeId("run", Date.UTC(2026, 0, 1))
    const later = makeId("run", Date.UTC(2026, 0, 1) + 1)
    expect(earlier < later).toBe(true)
  })

  it("keeps order when the clock steps back", () => {
    const a = makeId("run", Date.UTC(2030, 0, 1))
    const b = makeId("run", Date.UTC(2029, 0, 1))
    expect(a < b).toBe(true)
  })

  it("writes its 80 random bits as 16 base32 characters, the top bits first", () => {
    // The layout as a number: the 10 bytes big-endian, 5 bits a character from the top.
    const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
    const reference = (bytes: Uint8Array) => {
      let bits = 0n
      for (const b of bytes) bits = (bits << 8n) | BigInt(b)
      let tail = ""
      for (let i = 0; i < 16; i++) {
        tail = alphabet[Number(bits & 31n)] + tail
        bits >>= 5n
      }
      return tail
    }
    for (let n = 0; n < 200; n++) {
      const seed = `seed-${n}`
      const random = createHash("sha256").update(`run:${seed}`).digest().subarray(0, 10)
      expect(seededId("run", 1_764_129_158_323, seed).slice(-16)).toBe(reference(random))
    }
  })

  it("encodes its time", () => {
    const at = Date.UTC(2031, 5, 7, 8, 9, 10, 11)
    expect(idTime(makeId("evt", at))).toBe(at)
  })
})
