/**
 * "Changed after revision N" over a real nats-server: latest values in change order, the size
 * bound (always at least one value), deletions passed over but counted, other keys left out, and
 * a key written again while it is read still answered.
 */
import { Effect, ManagedRuntime, Schema } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { layerAll } from "../test/harness/NatsServer.ts"
import { makeId } from "./Ids.ts"
import * as Kv from "./Kv.ts"
import { changesAfter } from "./KvChanges.ts"
import { Nats } from "./Nats.ts"
import { Storage } from "./Storage.ts"

const runtime = ManagedRuntime.make(layerAll())
afterAll(() => runtime.dispose())

const Value = Schema.Struct({ n: Schema.Number, pad: Schema.String })

const bucket = Effect.flatMap(Storage, ({ names }) =>
  Effect.map(Kv.make(names.kv.commands.name, Value), (kv) => ({ kv, name: names.kv.commands.name })),
)

describe("changesAfter", () => {
  it("answers each changed key once, at its latest, in change order", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { kv, name } = yield* bucket
        const run = makeId("run")
        const r1 = yield* kv.put(`${run}.1`, { n: 1, pad: "" })
        yield* kv.put(`${run}.2`, { n: 2, pad: "" })
        yield* kv.put(`${makeId("run")}.1`, { n: 99, pad: "" })
        const r1b = yield* kv.put(`${run}.1`, { n: 11, pad: "" })
        const all = yield* changesAfter(name, Value, `${run}.*`, 0, 1_000_000)
        expect(all.entries.map((e) => [e.key, e.value.n])).toEqual([
          [`${run}.2`, 2],
          [`${run}.1`, 11],
        ])
        expect(all.through).toBe(r1b)
        expect(all.more).toBe(false)
        // After the first write of `.1`: both again (each changed since).
        expect((yield* changesAfter(name, Value, `${run}.*`, r1, 1_000_000)).entries.length).toBe(2)
        // After the last change: nothing, and the same point.
        expect(yield* changesAfter(name, Value, `${run}.*`, r1b, 1_000_000)).toEqual({
          entries: [],
          through: r1b,
          more: false,
        })
      }),
    ))

  it("stops at the size bound but always answers one value", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { kv, name } = yield* bucket
        const run = makeId("run")
        for (let i = 1; i <= 3; i++) yield* kv.put(`${run}.${i}`, { n: i, pad: "x".repeat(1000) })
        const first = yield* changesAfter(name, Value, `${run}.*`, 0, 10)
        expect(first.entries.map((e) => e.value.n)).toEqual([1])
        expect(first.more).toBe(true)
        const rest = yield* changesAfter(name, Value, `${run}.*`, first.through, 2500)
        expect(rest.entries.map((e) => e.value.n)).toEqual([2, 3])
        expect(rest.more).toBe(false)
      }),
    ))

  // The race the read must survive: a key written again after the read found the filter's end
  // loses the revision below that end, and its new one is past it. Made to happen every time by
  // writing the key again (on the same real server) as the first end is answered.
  it("answers a key written again while it was being read, once, at its latest", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { kv, name } = yield* bucket
        const run = makeId("run")
        yield* kv.put(`${run}.1`, { n: 1, pad: "" })
        yield* kv.put(`${run}.2`, { n: 2, pad: "" })
        const nats = yield* Nats
        let asked = 0
        const streams = new Proxy(nats.jsm.streams, {
          get: (target, key, receiver) =>
            key !== "getMessage"
              ? Reflect.get(target, key, receiver)
              : async (...args: Parameters<typeof target.getMessage>) => {
                  const answer = await target.getMessage(...args)
                  if (asked++ === 0) await Effect.runPromise(kv.put(`${run}.1`, { n: 11, pad: "" }))
                  return answer
                },
        })
        const racing = { ...nats, jsm: { ...nats.jsm, streams } as typeof nats.jsm }
        const read = yield* changesAfter(name, Value, `${run}.*`, 0, 1_000_000).pipe(
          Effect.provideService(Nats, racing),
        )
        expect(read.entries.map((e) => [e.key, e.value.n])).toEqual([
          [`${run}.2`, 2],
          [`${run}.1`, 11],
        ])
        expect(asked).toBeGreaterThan(1)
        expect(read.through).toBe(read.entries[1]?.revision)
        // A read no write overtook asks for the filter's end once, not again after it.
        const before = asked
        const quiet = yield* changesAfter(name, Value, `${run}.*`, 0, 1_000_000).pipe(
          Effect.provideService(Nats, racing),
        )
        expect(quiet.entries.map((e) => e.value.n)).toEqual([2, 11])
        expect(asked - before).toBe(1)
      }),
    ))

  it("passes over a deletion but reads past it", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { kv, name } = yield* bucket
        const run = makeId("run")
        yield* kv.put(`${run}.1`, { n: 1, pad: "" })
        const before = yield* kv.put(`${run}.2`, { n: 2, pad: "" })
        yield* kv.delete(`${run}.2`)
        const read = yield* changesAfter(name, Value, `${run}.*`, before, 1_000_000)
        expect(read.entries).toEqual([])
        expect(read.through).toBeGreaterThan(before)
      }),
    ))
})
