import { randomBytes } from "node:crypto"
import { Readable } from "node:stream"
import { expect, layer } from "@effect/vitest"
import { Chunk, Data, Effect, Option, Stream } from "effect"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import { attempt, Nats } from "./Nats.ts"
import * as ObjectStore from "./ObjectStore.ts"
import { Storage } from "./Storage.ts"

const files = Effect.flatMap(Storage, (s) => ObjectStore.make(s.names.objects.files.name))

const readAll = (store: ObjectStore.ObjectStore, name: string) =>
  Effect.gen(function* () {
    const found = Option.getOrThrow(yield* store.get(name))
    const parts = Chunk.toReadonlyArray(yield* Stream.runCollect(found.data))
    return { info: found.info, bytes: Buffer.concat(parts), parts: parts.length }
  })

class SourceBroke extends Data.TaggedError("SourceBroke")<{}> {}

// Chunk messages held in the bucket's stream, all objects together (tests compare before and after).
const storedChunks = (store: ObjectStore.ObjectStore) =>
  Effect.flatMap(Nats, ({ jsm }) =>
    attempt("chunks", async () => {
      const info = await jsm.streams.info(`OBJ_${store.bucket}`, {
        subjects_filter: `$O.${store.bucket}.C.>`,
      })
      return Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0)
    }),
  )

layer(layerAll())("ObjectStore", (it) => {
  // A run's start opens stores on its way (the input's, the output's): nats.js asked the server for
  // the account's JetStream info at each open, which sums every stream's usage.
  it.effect("opening a store asks the server nothing", () =>
    Effect.gen(function* () {
      const { connection } = yield* Nats
      const asked: Array<string> = []
      const sub = connection.subscribe("$JS.API.>", {
        callback: (_e, m) => {
          asked.push(m.subject)
        },
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => sub.unsubscribe()))
      yield* attempt("flush", () => connection.flush())
      for (let i = 0; i < 3; i++) yield* files
      yield* attempt("flush", () => connection.flush())
      expect(asked).toEqual([])
      // The subscription hears the API: a stream info asked for is seen.
      yield* Effect.flatMap(Nats, ({ jsm }) => attempt("info", () => jsm.streams.names().next()))
      yield* attempt("flush", () => connection.flush())
      expect(asked.length).toBeGreaterThan(0)
    }).pipe(Effect.scoped),
  )

  for (const size of [0, 1, 128 * 1024, 128 * 1024 + 1, 700_001]) {
    it.effect(`round trip of ${size} bytes from an Effect stream in uneven pieces`, () =>
      Effect.gen(function* () {
        const store = yield* files
        const name = uniqueName("obj")
        const data = randomBytes(size)
        const pieces: Array<Uint8Array> = []
        for (let at = 0; at < size; at += 50_000) pieces.push(data.subarray(at, Math.min(size, at + 50_000)))
        const info = yield* store.put(name, Stream.fromIterable(pieces))
        expect(info.size).toBe(size)
        expect(info.chunks).toBe(Math.ceil(size / (128 * 1024)))
        const back = yield* readAll(store, name)
        expect(back.bytes.equals(data)).toBe(true)
        expect(back.parts).toBe(info.chunks)
        expect(back.info).toEqual(info)
      }),
    )
  }

  it.effect("put from a Node Readable, info, replace, delete", () =>
    Effect.gen(function* () {
      const store = yield* files
      const name = uniqueName("obj")
      const first = randomBytes(300_000)
      const before = yield* storedChunks(store)
      yield* store.put(name, Readable.from([first.subarray(0, 1000), first.subarray(1000)]))
      expect((yield* readAll(store, name)).bytes.equals(first)).toBe(true)
      expect(yield* storedChunks(store)).toBe(before + 3)
      const second = Buffer.from("second version")
      const info = yield* store.put(name, Readable.from([second]), { description: "v2" })
      // The replaced object's three chunks are gone; the new one has one.
      expect(yield* storedChunks(store)).toBe(before + 1)
      expect(yield* store.info(name)).toEqual(Option.some(info))
      expect((yield* readAll(store, name)).bytes.toString()).toBe("second version")
      yield* store.delete(name)
      expect(yield* store.info(name)).toEqual(Option.none())
      expect(yield* store.get(name)).toEqual(Option.none())
      yield* store.delete(name)
      yield* store.delete(uniqueName("never-stored"))
    }),
  )

  it.effect("a failing source fails the put with its own error and keeps the earlier object", () =>
    Effect.gen(function* () {
      const store = yield* files
      const name = uniqueName("obj")
      yield* store.put(name, Stream.make(Buffer.from("kept")))
      const before = yield* storedChunks(store)
      // One full chunk is published before the source fails; the failed put purges it.
      const broken = Stream.make(new Uint8Array(200_000)).pipe(Stream.concat(Stream.fail(new SourceBroke())))
      const error = yield* store.put(name, broken).pipe(Effect.flip)
      expect(error).toBeInstanceOf(SourceBroke)
      expect(yield* storedChunks(store)).toBe(before)
      expect((yield* readAll(store, name)).bytes.toString()).toBe("kept")
    }),
  )
})
