import { describe, expect, it } from "vitest"
import { idTime, makeId } from "./Ids.ts"

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

  it("encodes its time", () => {
    const at = Date.UTC(2031, 5, 7, 8, 9, 10, 11)
    expect(idTime(makeId("evt", at))).toBe(at)
  })
})
