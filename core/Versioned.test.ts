import { expect, layer } from "@effect/vitest"
import { Effect, Either, Option, Schema } from "effect"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import * as Kv from "./Kv.ts"
import { Storage } from "./Storage.ts"
import { appendVersion } from "./Versioned.ts"

const Head = Schema.Struct({ latest: Schema.Number })
const Item = Schema.Struct({ n: Schema.Number, by: Schema.String })

const views = Effect.flatMap(Storage, (s) =>
  Effect.all({
    heads: Kv.make(s.names.kv.functions.name, Head),
    items: Kv.make(s.names.kv.versions.name, Item),
  }),
)

const append = (v: Effect.Effect.Success<typeof views>, id: string, by: string) =>
  appendVersion({
    what: "thing",
    heads: v.heads,
    headKey: id,
    latestOf: (h) => h.latest,
    versions: v.items,
    versionKey: (n) => `${id}.${n}`,
    make: (n) => ({ n, by }),
    advance: (_, n) => ({ latest: n }),
  })

layer(layerAll())("appendVersion", (it) => {
  it.effect("16 concurrent appends take 16 distinct consecutive numbers and the head ends at the last", () =>
    Effect.gen(function* () {
      const v = yield* views
      const id = uniqueName("f")
      yield* v.heads.create(id, { latest: 1 })
      const results = yield* Effect.forEach(
        Array.from({ length: 16 }, (_, i) => `w${i}`),
        (by) => Effect.either(append(v, id, by)),
        { concurrency: "unbounded" },
      )
      const numbers = results.flatMap((r) => (Either.isRight(r) ? [r.right.n] : [])).sort((a, b) => a - b)
      expect(numbers).toEqual(Array.from({ length: 16 }, (_, i) => i + 2))
      expect(Option.getOrThrow(yield* v.heads.get(id)).value.latest).toBe(17)
    }),
  )

  it.effect(
    "a version left by a publisher that died before moving the head is skipped, never overwritten",
    () =>
      Effect.gen(function* () {
        const v = yield* views
        const id = uniqueName("f")
        yield* v.heads.create(id, { latest: 1 })
        yield* v.items.create(`${id}.2`, { n: 2, by: "dead" })
        const next = yield* append(v, id, "live")
        expect(next).toEqual({ n: 3, by: "live" })
        expect(Option.getOrThrow(yield* v.items.get(`${id}.2`)).value.by).toBe("dead")
        expect(Option.getOrThrow(yield* v.heads.get(id)).value.latest).toBe(3)
      }),
  )

  it.effect("no head is not_found and writes nothing", () =>
    Effect.gen(function* () {
      const v = yield* views
      const id = uniqueName("f")
      const error = yield* Effect.flip(append(v, id, "x"))
      expect(error).toMatchObject({ _tag: "ApiError", code: "not_found" })
      expect(yield* v.items.keys(`${id}.*`)).toEqual([])
    }),
  )
})
