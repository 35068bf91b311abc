import { expect, layer } from "@effect/vitest"
import { Effect, Option } from "effect"
import { Version } from "../schema/Function.ts"
import type { AccountId, FunctionId } from "../schema/Ids.ts"
import { layerAll } from "../test/harness/NatsServer.ts"
import { testVersion } from "../test/harness/versions.ts"
import { functionKeys, make, makeKeeping } from "./Functions.ts"
import { makeId } from "./Ids.ts"
import * as Kv from "./Kv.ts"
import { Storage } from "./Storage.ts"

const ACCOUNT = makeId("acc") as AccountId

const versionOf = (fn: FunctionId, n: number, prompt = `prompt ${n}`): Version =>
  testVersion(fn, n, { system_prompt: prompt })

/** Removes version `n` of `fn` from KV behind the store's back: only a version kept in memory is still answered. */
const removeFromKv = (fn: FunctionId, n: number) =>
  Effect.flatMap(
    Effect.flatMap(Storage, (s) => Kv.make(s.names.kv.versions.name, Version)),
    (kv) => kv.delete(functionKeys.version(fn, n)),
  )

layer(layerAll())("Functions: versions kept in memory", (it) => {
  it.effect("a version read once is answered again without KV; another process reads KV", () =>
    Effect.gen(function* () {
      const writer = yield* make
      const fn = makeId("fnc") as FunctionId
      yield* writer.create(ACCOUNT, versionOf(fn, 1), "kept")
      const reader = yield* make
      expect(Option.getOrThrow(yield* reader.version(fn, 1)).system_prompt).toBe("prompt 1")
      yield* removeFromKv(fn, 1)
      // Still answered: the reader kept it. A process that never read it finds none in KV.
      expect(Option.getOrThrow(yield* reader.version(fn, 1)).system_prompt).toBe("prompt 1")
      expect(Option.isNone(yield* (yield* make).version(fn, 1))).toBe(true)
    }),
  )

  it.effect("versions this process wrote (create and publish) are kept as written", () =>
    Effect.gen(function* () {
      const store = yield* make
      const fn = makeId("fnc") as FunctionId
      yield* store.create(ACCOUNT, versionOf(fn, 1), "written")
      const v2 = yield* store.publish(ACCOUNT, fn, (n) => versionOf(fn, n, "second"))
      expect(v2.version).toBe(2)
      yield* removeFromKv(fn, 1)
      yield* removeFromKv(fn, 2)
      expect(Option.getOrThrow(yield* store.version(fn, 1)).system_prompt).toBe("prompt 1")
      expect(Option.getOrThrow(yield* store.version(fn, 2)).system_prompt).toBe("second")
    }),
  )

  it.effect("a version not found is not kept: published afterwards, it is found", () =>
    Effect.gen(function* () {
      const reader = yield* make
      const writer = yield* make
      const fn = makeId("fnc") as FunctionId
      yield* writer.create(ACCOUNT, versionOf(fn, 1), "later")
      expect(Option.isNone(yield* reader.version(fn, 2))).toBe(true)
      yield* writer.publish(ACCOUNT, fn, (n) => versionOf(fn, n, "published later"))
      expect(Option.getOrThrow(yield* reader.version(fn, 2)).system_prompt).toBe("published later")
    }),
  )

  it.effect("memory is bounded: past the bound the oldest kept goes, and is read from KV again", () =>
    Effect.gen(function* () {
      const writer = yield* make
      const fn = makeId("fnc") as FunctionId
      yield* writer.create(ACCOUNT, versionOf(fn, 1), "bounded")
      for (let i = 0; i < 3; i++) yield* writer.publish(ACCOUNT, fn, (n) => versionOf(fn, n))
      // Room for two versions of this size, not three.
      const size = JSON.stringify(versionOf(fn, 1)).length
      const reader = yield* makeKeeping(2 * size + 10)
      for (const n of [1, 2, 3]) expect(Option.isSome(yield* reader.version(fn, n))).toBe(true)
      for (const n of [1, 2, 3]) yield* removeFromKv(fn, n)
      // 1 went to make room for 3; 2 and 3 are still kept.
      expect(Option.isNone(yield* reader.version(fn, 1))).toBe(true)
      expect(Option.getOrThrow(yield* reader.version(fn, 2)).version).toBe(2)
      expect(Option.getOrThrow(yield* reader.version(fn, 3)).version).toBe(3)
      // A version larger than the whole bound is never kept.
      const tiny = yield* makeKeeping(10)
      yield* writer.publish(ACCOUNT, fn, (n) => versionOf(fn, n))
      expect(Option.isSome(yield* tiny.version(fn, 5))).toBe(true)
      yield* removeFromKv(fn, 5)
      expect(Option.isNone(yield* tiny.version(fn, 5))).toBe(true)
    }),
  )

  it.effect("ids and numbers no version can have are none, without a read", () =>
    Effect.gen(function* () {
      const store = yield* make
      expect(Option.isNone(yield* store.version("not-an-id", 1))).toBe(true)
      const fn = makeId("fnc") as FunctionId
      for (const n of [0, -1, 1.5, Number.NaN]) expect(Option.isNone(yield* store.version(fn, n))).toBe(true)
    }),
  )
})
