import { createHash } from "node:crypto"
import { expect, layer } from "@effect/vitest"
import { Effect, Option, Stream } from "effect"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import * as ObjectStore from "./ObjectStore.ts"
import { Storage } from "./Storage.ts"

const MiB = 1024 * 1024
const SIZE = 64 * MiB

// A deterministic 64 MiB source produced piece by piece, so the test itself holds no whole copy.
const piece = (i: number) => {
  const b = Buffer.alloc(MiB)
  b.fill(i % 251)
  b.writeUInt32BE(i, 0)
  return b
}
const source = Stream.range(0, SIZE / MiB - 1).pipe(Stream.rechunk(1), Stream.map(piece))

layer(layerAll(), { timeout: 120_000 })("ObjectStore (64 MiB)", (it) => {
  it.effect(
    "streams a 64 MiB object in and out with matching size and digest",
    () =>
      Effect.gen(function* () {
        const { names } = yield* Storage
        const store = yield* ObjectStore.make(names.objects.outputs.name)
        const name = uniqueName("big")
        const expected = createHash("sha256")
        for (let i = 0; i < SIZE / MiB; i++) expected.update(piece(i))
        const info = yield* store.put(name, source)
        expect(info.size).toBe(SIZE)
        expect(info.chunks).toBe(SIZE / (128 * 1024))
        const found = Option.getOrThrow(yield* store.get(name))
        const hash = createHash("sha256")
        let size = 0
        yield* found.data.pipe(
          Stream.runForEach((c) =>
            Effect.sync(() => {
              hash.update(c)
              size += c.byteLength
            }),
          ),
        )
        expect(size).toBe(SIZE)
        expect(hash.digest("hex")).toBe(expected.digest("hex"))
        yield* store.delete(name)
      }),
    120_000,
  )
})
