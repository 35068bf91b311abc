// 200 MB through seal and open in one streaming pipeline: the output equals the input (by hash)
// and the process's resident memory stays flat (a resource bound, not a timing assertion).
import { createHash, randomFillSync } from "node:crypto"
import { Readable, Writable } from "node:stream"
import { pipeline } from "node:stream/promises"
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Option, Stream } from "effect"
import * as Keyring from "./Keyring.ts"
import * as MasterKey from "./MasterKey.ts"
import { SealStream, layer as sealStreamLayer } from "./SealStream.ts"
import * as WrappedKeyStore from "./WrappedKeyStore.ts"

const TestLayer = sealStreamLayer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
)

const TOTAL = 200 * 1024 * 1024
// Not a multiple of the chunk size, so pieces straddle chunk boundaries.
const PIECE = 100_003
const RSS_BOUND = 64 * 1024 * 1024
const ACC = "acc_0000000000000000000000000a"
const OBJ = "file_0000000000000000000000000a"

// Random pieces made on demand: the input never exists in memory as a whole.
const piece = (sent: number): Buffer => randomFillSync(Buffer.allocUnsafe(Math.min(PIECE, TOTAL - sent)))

// Every chunk of the pipeline is fresh garbage outside the JS heap, which V8 collects lazily (its
// external-memory trigger alone is 64 MiB), so RSS would measure the collector's laziness rather
// than what the pipeline holds. A full collection every 8 MiB of output (and before the baseline)
// removes that noise: what remains is what the code retains, which must not grow with the size.
setFlagsFromString("--expose-gc")
const gc = runInNewContext("gc") as () => void
const GC_EVERY = 8 * 1024 * 1024

// Peak RSS, sampled by a timer and by the pipeline itself (the timer may starve while it runs).
const rssMeter = () => {
  gc()
  const before = process.memoryUsage.rss()
  let peak = before
  let sinceGc = 0
  const sample = (bytes = 0) => {
    peak = Math.max(peak, process.memoryUsage.rss())
    sinceGc += bytes
    if (sinceGc >= GC_EVERY) {
      sinceGc = 0
      gc()
    }
  }
  const timer = setInterval(() => sample(), 5)
  return {
    sample,
    stop: () => {
      clearInterval(timer)
      sample()
      return { before, peak, growth: peak - before }
    },
  }
}

const report = (label: string, r: { before: number; peak: number; growth: number }) =>
  console.log(
    `${label}: rss before ${(r.before / 2 ** 20).toFixed(1)} MiB, peak ${(r.peak / 2 ** 20).toFixed(1)} MiB, growth ${(r.growth / 2 ** 20).toFixed(1)} MiB`,
  )

describe("SealStream at 200 MB", () => {
  it.effect(
    "Effect Stream: seal then open streams 200 MB with output hash = input hash and flat memory",
    () =>
      Effect.gen(function* () {
        const service = yield* SealStream
        // Warm up code paths and buffers so the baseline is not the cold process.
        yield* Stream.make(Buffer.alloc(1 << 20)).pipe(
          service.seal(ACC, OBJ),
          service.open(ACC, OBJ),
          Stream.runDrain,
        )
        const inHash = createHash("sha256")
        const outHash = createHash("sha256")
        let sealedBytes = 0
        let outBytes = 0
        const meter = rssMeter()
        yield* Stream.unfold(0, (sent) =>
          sent >= TOTAL
            ? Option.none()
            : Option.some([piece(sent), sent + Math.min(PIECE, TOTAL - sent)] as const),
        ).pipe(
          Stream.tap((b) => Effect.sync(() => inHash.update(b))),
          service.seal(ACC, OBJ),
          Stream.tap((b) =>
            Effect.sync(() => {
              sealedBytes += b.byteLength
            }),
          ),
          service.open(ACC, OBJ),
          Stream.runForEach((b) =>
            Effect.sync(() => {
              outHash.update(b)
              outBytes += b.byteLength
              meter.sample(b.byteLength)
            }),
          ),
        )
        const rss = meter.stop()
        report("Effect Stream", rss)
        expect(outBytes).toBe(TOTAL)
        expect(sealedBytes).toBeGreaterThan(TOTAL)
        expect(outHash.digest("hex")).toBe(inHash.digest("hex"))
        expect(rss.growth).toBeLessThan(RSS_BOUND)
      }).pipe(Effect.provide(TestLayer)),
    120_000,
  )

  it.effect(
    "Node Transforms: seal then open 200 MB through pipeline() with output hash = input hash and flat memory",
    () =>
      Effect.gen(function* () {
        const service = yield* SealStream
        const sealT = yield* service.sealTransform(ACC, OBJ)
        const openT = yield* service.openTransform(ACC, OBJ)
        const inHash = createHash("sha256")
        const outHash = createHash("sha256")
        let outBytes = 0
        const meter = rssMeter()
        const source = Readable.from(
          (function* () {
            for (let sent = 0; sent < TOTAL; sent += PIECE) {
              const b = piece(sent)
              inHash.update(b)
              yield b
            }
          })(),
          { objectMode: false },
        )
        const sink = new Writable({
          write(chunk: Buffer, _encoding, callback) {
            outHash.update(chunk)
            outBytes += chunk.byteLength
            meter.sample(chunk.byteLength)
            callback()
          },
        })
        yield* Effect.promise(() => pipeline(source, sealT, openT, sink))
        const rss = meter.stop()
        report("Node Transform", rss)
        expect(outBytes).toBe(TOTAL)
        expect(outHash.digest("hex")).toBe(inHash.digest("hex"))
        expect(rss.growth).toBeLessThan(RSS_BOUND)
      }).pipe(Effect.provide(TestLayer)),
    120_000,
  )
})
