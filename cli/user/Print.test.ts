/** How the CLI writes sizes and durations for people (the progress line, listings), and when in colour. */
import { afterEach, describe, expect, it } from "vitest"
import { bytes, duration, outOf, red } from "./Print.ts"

describe("outOf", () => {
  // The streams' own answers, replaced for a test and put back.
  const terminal = (stream: NodeJS.WriteStream, isTTY: boolean) =>
    Object.defineProperty(stream, "isTTY", { value: isTTY, configurable: true, writable: true })
  const before = { stdout: process.stdout.isTTY, stderr: process.stderr.isTTY }
  afterEach(() => {
    terminal(process.stdout, before.stdout)
    terminal(process.stderr, before.stderr)
  })

  it("colour only when stdout is a terminal and NO_COLOR is unset or empty", () => {
    terminal(process.stdout, true)
    expect(outOf(false, {}).color).toBe(true)
    expect(outOf(false, { NO_COLOR: "" }).color).toBe(true)
    expect(outOf(false, { NO_COLOR: "1" }).color).toBe(false)
    expect(red(outOf(false, {}), "failed")).toBe("\x1b[31mfailed\x1b[0m")
    expect(red(outOf(false, { NO_COLOR: "1" }), "failed")).toBe("failed")
    terminal(process.stdout, false)
    expect(outOf(false, {}).color).toBe(false)
  })

  it("progress in place only when stderr is a terminal; each asked when first read, then kept", () => {
    terminal(process.stderr, false)
    const out = outOf(true, {})
    terminal(process.stderr, true)
    terminal(process.stdout, true)
    expect(out).toMatchObject({ json: true, tty: true, color: true })
    terminal(process.stderr, false)
    terminal(process.stdout, false)
    expect(out).toMatchObject({ tty: true, color: true })
    expect(outOf(true, {})).toMatchObject({ tty: false, color: false })
  })
})

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
