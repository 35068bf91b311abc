/** How the CLI writes sizes and durations for people (the progress line, listings). */
import { describe, expect, it } from "vitest"
import { bytes, duration } from "./Print.ts"

describe("bytes", () => {
  it("whole bytes below 1 kB, a fraction of one (a rate) rounded", () => {
    expect(bytes(0)).toBe("0 B")
    expect(bytes(999)).toBe("999 B")
    expect(bytes(46.15384615384615)).toBe("46 B")
    expect(bytes(0.4)).toBe("0 B")
  })

  it("one decimal below 10 of a unit, none from 10, at powers of 1000", () => {
    expect(bytes(1000)).toBe("1.0 kB")
    expect(bytes(1500)).toBe("1.5 kB")
    expect(bytes(15_000)).toBe("15 kB")
    expect(bytes(2_500_000)).toBe("2.5 MB")
    expect(bytes(3 * 10 ** 12)).toBe("3.0 TB")
    expect(bytes(5 * 10 ** 15)).toBe("5000 TB")
  })
})

describe("duration", () => {
  it("seconds, then minutes and seconds, then hours and minutes; '-' when unknown", () => {
    expect(duration(0)).toBe("0s")
    expect(duration(59.4)).toBe("59s")
    expect(duration(65)).toBe("1m05s")
    expect(duration(3600 + 120)).toBe("1h02m")
    expect(duration(Number.NaN)).toBe("-")
    expect(duration(-1)).toBe("-")
  })
})
