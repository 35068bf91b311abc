import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Schema } from "effect"
import * as Actor from "../../../schema/actors/Actor.ts"
import { Run, type RunActorState } from "../../../schema/actors/Run.ts"
import { emptyUsage } from "../../../schema/Run.ts"
import { codecsOf } from "./Codecs.ts"

const id = (prefix: string, n: number) => `${prefix}_${String(n).padStart(26, "0")}`

// A run as the run actor keeps it once it runs: the large part of its state.
const storedRun = (n: number) => ({
  id: id("run", n),
  account: id("acc", 1),
  function: id("fnc", 1),
  version: 1,
  base: "debian-trixie-20250101-abcd1234",
  size: "s",
  provider: "none",
  prompt: "bench",
  state: "running",
  created_at: "2026-11-26T03:52:38.123Z",
  started_at: "2026-11-26T03:52:38.323Z",
  created_by: id("key", 1),
  usage: emptyUsage("s"),
  memory_mib: 1024,
  timeout_minutes: 60,
  log_parts: 0,
  host: "host-1",
  seq: 5,
})

const runState = (n: number): RunActorState =>
  Schema.decodeUnknownSync(Run.state)({
    run: storedRun(n),
    next_sequence: 1,
    charged_through: 1,
    rate_usd_nanos_per_gib_hour: 1000,
    ready_at: 1_764_129_158_323,
  })

const plainly = (schema: Schema.Schema<unknown, unknown>) => Schema.encodeUnknownEither(schema)

describe("codecsOf(actor).encodeState", () => {
  it("answers what the whole schema answers while a handler carries the same run along", () => {
    const { encodeState } = codecsOf(Run)
    const plain = plainly(Run.state as Schema.Schema<unknown, unknown>)
    let state = runState(1)
    for (let n = 1; n <= 5; n++) {
      state = { ...state, next_sequence: n + 1, ...(n % 2 === 0 ? { watch_at: n } : {}) }
      const encoded = encodeState(state)
      expect(encoded).toEqual(plain(state))
      // Key for key, in the schema's order: the stored JSON is the same text.
      expect(JSON.stringify(Either.getOrThrow(encoded))).toBe(JSON.stringify(Either.getOrThrow(plain(state))))
    }
    const other = {
      ...state,
      run: { ...state.run!, state: "succeeded" as const, ended_at: state.run!.started_at },
    }
    expect(encodeState(other)).toEqual(plain(other))
    const none = { ...state, run: undefined }
    expect(encodeState(none)).toEqual(plain(none))
  })

  it("encodes again an object changed in place since it was last encoded", () => {
    const { encodeState } = codecsOf(Run)
    const state = runState(2)
    expect(Either.getOrThrow(encodeState(state))).toMatchObject({ run: { log_parts: 0 } })
    ;(state.run as { log_parts: number }).log_parts = 3
    expect(Either.getOrThrow(encodeState({ ...state, next_sequence: 2 }))).toMatchObject({
      run: { log_parts: 3 },
    })
    // Changed in place into something that does not encode: refused, with the whole schema's error.
    ;(state.run as { log_parts: number }).log_parts = -1
    const refused = encodeState({ ...state })
    expect(Either.isLeft(refused)).toBe(true)
    expect(Either.getLeft(refused)).toEqual(
      Either.getLeft(plainly(Run.state as Schema.Schema<unknown, unknown>)(state)),
    )
  })

  it("leaves a state that differs from its stored form, or is not a plain struct, to its schema", () => {
    const Stamped = Actor.make({
      name: "stamped-codecs",
      state: Schema.Struct({ count: Schema.NumberFromString, seen: Schema.Array(Schema.DateFromString) }),
      initial: { count: 0, seen: [] },
      message: Schema.TaggedStruct("Stamp", {}),
      handler: (state) => Effect.succeed({ state }),
    })
    const { encodeState } = codecsOf(Stamped)
    const seen = [new Date(1_000)]
    expect(Either.getOrThrow(encodeState({ count: 1, seen }))).toEqual({
      count: "1",
      seen: ["1970-01-01T00:00:01.000Z"],
    })
    seen[0]!.setTime(2_000)
    expect(Either.getOrThrow(encodeState({ count: 2, seen }))).toEqual({
      count: "2",
      seen: ["1970-01-01T00:00:02.000Z"],
    })
    const Checked = Actor.make({
      name: "checked-codecs",
      state: Schema.Struct({ a: Schema.Number, b: Schema.Number }).pipe(
        Schema.filter((s) => s.a <= s.b || "a must not pass b"),
      ),
      initial: { a: 0, b: 0 },
      message: Schema.TaggedStruct("Noop", {}),
      handler: (state) => Effect.succeed({ state }),
    })
    expect(Either.isLeft(codecsOf(Checked).encodeState({ a: 2, b: 1 }))).toBe(true)
    expect(Either.getOrThrow(codecsOf(Checked).encodeState({ a: 1, b: 2 }))).toEqual({ a: 1, b: 2 })
  })
})
