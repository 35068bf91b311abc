import { Cause, Effect, FiberId, FiberRefs, HashMap, List, LogLevel, Redacted } from "effect"
import { describe, expect, it } from "vitest"
import { layerCollect, render } from "./Log.ts"

const canary = "sk-canary-5f1d2c"

describe("JSON logger", () => {
  it("writes one JSON object per line with level, message and annotations", () => {
    const lines: Array<string> = []
    Effect.runSync(
      Effect.logInfo("run placed").pipe(
        Effect.annotateLogs({ run: "run_x", host: "h1" }),
        Effect.provide(layerCollect(lines)),
      ),
    )
    expect(lines).toHaveLength(1)
    const entry = JSON.parse(lines[0]!)
    expect(entry).toMatchObject({ level: "info", msg: "run placed", run: "run_x", host: "h1" })
    expect(Number.isNaN(Date.parse(entry.at))).toBe(false)
  })

  it("puts the fields of (text, plain object) beside the annotations, never over at, level or msg", () => {
    const lines: Array<string> = []
    const secret = Redacted.make(canary)
    Effect.runSync(
      Effect.gen(function* () {
        yield* Effect.logInfo("handled", {
          actor: "run",
          seq: 7,
          msg: "not this",
          key: secret,
          deep: { key: secret },
        })
        yield* Effect.logInfo("failed", new Error("boom"))
      }).pipe(Effect.annotateLogs({ worker: "w1" }), Effect.provide(layerCollect(lines))),
    )
    expect(JSON.parse(lines[0]!)).toMatchObject({
      level: "info",
      msg: "handled",
      worker: "w1",
      actor: "run",
      seq: 7,
      key: "<redacted>",
      deep: { key: "<redacted>" },
    })
    expect(lines[0]).not.toContain(canary)
    // An error is not a bag of fields: it stays in the message.
    expect(JSON.parse(lines[1]!).msg).toEqual(["failed", { error: "Error", message: "boom" }])
  })

  it("never prints a Redacted value, in messages, nested objects or annotations", () => {
    const lines: Array<string> = []
    const secret = Redacted.make(canary)
    Effect.runSync(
      Effect.gen(function* () {
        yield* Effect.logInfo("key", secret)
        yield* Effect.logWarning({ provider: { key: secret, list: [secret] } })
        yield* Effect.logError("settings").pipe(Effect.annotateLogs({ key: secret }))
        yield* Effect.logError("failure", new Error(`bad ${String(secret)}`))
      }).pipe(Effect.provide(layerCollect(lines))),
    )
    expect(lines).toHaveLength(4)
    for (const line of lines) {
      expect(line).not.toContain(canary)
      expect(() => JSON.parse(line)).not.toThrow()
    }
    expect(lines.join("\n")).toContain("<redacted>")
  })

  it("each line has its own time, to the millisecond, whatever came before it", () => {
    // The time's text is kept for the millisecond of the line before: the same, later and earlier
    // times, each rendered as its own.
    const at = (ms: number) =>
      JSON.parse(
        render({
          fiberId: FiberId.none,
          logLevel: LogLevel.Info,
          message: "tick",
          cause: Cause.empty,
          context: FiberRefs.empty(),
          spans: List.empty(),
          annotations: HashMap.empty(),
          date: new Date(ms),
        }),
      ).at
    const base = Date.parse("2026-11-27T05:00:00.000Z")
    for (const ms of [base, base, base + 1, base + 1, base, base + 86_400_000, base + 999, base])
      expect(at(ms)).toBe(new Date(ms).toISOString())
  })

  it("survives cycles and binary values", () => {
    const lines: Array<string> = []
    const cyclic: Record<string, unknown> = { name: "a" }
    cyclic.self = cyclic
    Effect.runSync(Effect.logInfo(cyclic, new Uint8Array(12), 10n).pipe(Effect.provide(layerCollect(lines))))
    const entry = JSON.parse(lines[0]!)
    expect(entry.msg).toEqual([{ name: "a", self: "[cycle]" }, "<12 bytes>", "10"])
  })
})
