import { createSecretKey, randomBytes } from "node:crypto"
import { Readable, Writable } from "node:stream"
import { pipeline } from "node:stream/promises"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Either, Layer, Stream } from "effect"
import { DecryptFailed } from "./Aead.ts"
import * as Keyring from "./Keyring.ts"
import * as MasterKey from "./MasterKey.ts"
import {
  DEFAULT_CHUNK_SIZE,
  HEADER_BYTES,
  type Machine,
  makeOpener,
  makeSealer,
  SealStream,
  sealedSize,
  layer as sealStreamLayer,
} from "./SealStream.ts"
import * as WrappedKeyStore from "./WrappedKeyStore.ts"

const TestLayer = sealStreamLayer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
)

const key = createSecretKey(randomBytes(32))
const ACC = "acc_0000000000000000000000000a"
const OBJ = "file_0000000000000000000000000a"
const TAG = 16

// Feeds `input` in pieces of irregular sizes (including empty ones) so every buffering path runs.
const pieces = (input: Uint8Array, seed = 7): Array<Uint8Array> => {
  const out: Array<Uint8Array> = []
  let at = 0
  let s = seed
  while (at < input.byteLength) {
    s = (s * 1103515245 + 12345) % 2 ** 31
    const n = s % 5 === 0 ? 0 : 1 + (s % (2 * DEFAULT_CHUNK_SIZE + 3))
    out.push(input.subarray(at, at + n))
    at += n
  }
  return out
}

const run = (machine: Machine, parts: ReadonlyArray<Uint8Array>): Buffer => {
  const out: Array<Uint8Array> = []
  for (const p of parts) out.push(...machine.push(p))
  out.push(...machine.end())
  return Buffer.concat(out)
}

const seal = (plain: Uint8Array, chunkSize = DEFAULT_CHUNK_SIZE, account = ACC, obj = OBJ) =>
  run(makeSealer(key, account, obj, chunkSize), pieces(plain))

// Opens and returns the error, failing the test if opening succeeded.
const openError = (sealed: Uint8Array, account = ACC, obj = OBJ): DecryptFailed => {
  try {
    run(makeOpener(key, account, obj), pieces(sealed, 11))
  } catch (error) {
    expect(error).toBeInstanceOf(DecryptFailed)
    return error as DecryptFailed
  }
  throw new Error("opened a sealed object that should not open")
}

const sizes = [
  ["0 bytes", 0],
  ["1 byte", 1],
  ["exactly one chunk", DEFAULT_CHUNK_SIZE],
  ["one chunk + 1", DEFAULT_CHUNK_SIZE + 1],
  ["many chunks", DEFAULT_CHUNK_SIZE * 7 + 12_345],
  ["many whole chunks", DEFAULT_CHUNK_SIZE * 5],
] as const

describe("SealStream machines", () => {
  for (const [name, size] of sizes) {
    it(`round-trips ${name}, fed in irregular pieces, at the predicted size`, () => {
      const plain = randomBytes(size)
      const sealed = seal(plain)
      expect(sealed.byteLength).toBe(sealedSize(size))
      expect(sealed.subarray(0, 4).toString("latin1")).toBe("HGSO")
      expect(run(makeOpener(key, ACC, OBJ), pieces(sealed, 3)).equals(plain)).toBe(true)
      // Byte by byte, to be sure no piece boundary matters.
      if (size <= DEFAULT_CHUNK_SIZE + 1) {
        const bytes = Array.from(sealed, (b) => Uint8Array.of(b))
        expect(run(makeOpener(key, ACC, OBJ), bytes).equals(plain)).toBe(true)
      }
    })
  }

  it("round-trips with a tiny chunk size (many chunks, byte-by-byte input)", () => {
    const plain = randomBytes(1000)
    const sealed = run(
      makeSealer(key, ACC, OBJ, 7),
      Array.from(plain, (b) => Uint8Array.of(b)),
    )
    expect(sealed.byteLength).toBe(sealedSize(1000, 7))
    expect(run(makeOpener(key, ACC, OBJ), [sealed]).equals(plain)).toBe(true)
  })

  it("two seals of the same bytes differ (fresh salt per object)", () => {
    const plain = randomBytes(100)
    expect(seal(plain).equals(seal(plain))).toBe(false)
  })

  it("rejects a chunk size out of range when sealing", () => {
    expect(() => makeSealer(key, ACC, OBJ, 0)).toThrow(RangeError)
    expect(() => makeSealer(key, ACC, OBJ, 16 * 1024 * 1024 + 1)).toThrow(RangeError)
    expect(() => makeSealer(key, ACC, OBJ, 16 * 1024 * 1024)).not.toThrow()
  })

  it("a flipped bit anywhere (header, body, tags) fails", () => {
    // Small chunks keep the object short enough to try every single bit: 4 chunks, 155 bytes.
    const plain = Buffer.from("the quick brown fox jumps over the lazy dog, twice!")
    const sealed = seal(plain, 16)
    expect(sealed.byteLength).toBe(HEADER_BYTES + plain.byteLength + 4 * TAG)
    for (let bit = 0; bit < sealed.byteLength * 8; bit++) {
      const bad = Buffer.from(sealed)
      bad[bit >> 3]! ^= 1 << (bit & 7)
      const error = openError(bad)
      expect(error.message).not.toContain("quick")
    }
  })

  it("swapped chunks fail", () => {
    const chunk = 16
    const sealed = seal(randomBytes(chunk * 4), chunk)
    const frame = (i: number) =>
      sealed.subarray(HEADER_BYTES + i * (chunk + TAG), HEADER_BYTES + (i + 1) * (chunk + TAG))
    const swapped = Buffer.concat([sealed.subarray(0, HEADER_BYTES), frame(1), frame(0), frame(2), frame(3)])
    expect(swapped.byteLength).toBe(sealed.byteLength)
    expect(openError(swapped).reason).toMatch(/chunk 0/)
    // The last chunk moved to the middle fails too (its final flag and index do not match).
    const lastMoved = Buffer.concat([
      sealed.subarray(0, HEADER_BYTES),
      frame(0),
      frame(3),
      frame(2),
      frame(1),
    ])
    openError(lastMoved)
  })

  it("a truncated object fails: at a chunk boundary, mid-chunk, header only, mid-header, empty", () => {
    const chunk = 16
    const sealed = seal(randomBytes(chunk * 3 + 5), chunk)
    const lastStart = HEADER_BYTES + 3 * (chunk + TAG)
    expect(openError(sealed.subarray(0, lastStart)).reason).toMatch(/chunk 2 \(last\)/)
    openError(sealed.subarray(0, sealed.byteLength - 1))
    openError(sealed.subarray(0, lastStart + 3))
    expect(openError(sealed.subarray(0, HEADER_BYTES)).reason).toMatch(/truncated chunk/)
    expect(openError(sealed.subarray(0, HEADER_BYTES - 1)).reason).toMatch(/truncated header/)
    expect(openError(new Uint8Array(0)).reason).toMatch(/truncated header/)
  })

  it("an appended chunk fails: a repeat of the last one, or one from another sealing of the object", () => {
    const chunk = 16
    const plain = randomBytes(chunk * 2)
    const sealed = seal(plain, chunk)
    const last = sealed.subarray(sealed.byteLength - (chunk + TAG))
    openError(Buffer.concat([sealed, last]))
    const other = seal(randomBytes(chunk * 3), chunk)
    openError(Buffer.concat([sealed, other.subarray(HEADER_BYTES + 2 * (chunk + TAG))]))
    openError(Buffer.concat([sealed, Buffer.of(0)]))
  })

  it("the wrong account, object id or key fails", () => {
    const sealed = seal(randomBytes(DEFAULT_CHUNK_SIZE + 10))
    openError(sealed, "acc_0000000000000000000000000b", OBJ)
    openError(sealed, ACC, "file_0000000000000000000000000b")
    const otherKey = createSecretKey(randomBytes(32))
    expect(() => run(makeOpener(otherKey, ACC, OBJ), [sealed])).toThrow(DecryptFailed)
  })

  it("garbage and a header claiming an oversized chunk fail without allocating it", () => {
    openError(randomBytes(200))
    const sealed = Buffer.from(seal(randomBytes(10)))
    sealed.writeUInt32BE(0xffff_ffff, 5)
    expect(openError(sealed).reason).toMatch(/chunk size/)
    sealed.writeUInt32BE(0, 5)
    expect(openError(sealed).reason).toMatch(/chunk size/)
  })
})

describe("SealStream service", () => {
  it.effect("Stream transforms round-trip and a tampered object fails with DecryptFailed", () =>
    Effect.gen(function* () {
      const service = yield* SealStream
      for (const [, size] of sizes) {
        const plain = randomBytes(size)
        const sealedChunks = yield* Stream.fromIterable(pieces(plain)).pipe(
          service.seal(ACC, OBJ),
          Stream.runCollect,
        )
        const sealed = Buffer.concat(Chunk.toArray(sealedChunks))
        expect(sealed.byteLength).toBe(sealedSize(size))
        const opened = yield* Stream.fromIterable(pieces(sealed, 5)).pipe(
          service.open(ACC, OBJ),
          Stream.runCollect,
        )
        expect(Buffer.concat(Chunk.toArray(opened)).equals(plain)).toBe(true)

        const bad = Buffer.from(sealed)
        bad[bad.byteLength - 1]! ^= 0x80
        const failed = yield* Stream.make(bad).pipe(service.open(ACC, OBJ), Stream.runCollect, Effect.either)
        expect(Either.isLeft(failed) && failed.left._tag).toBe("DecryptFailed")
        const wrongAccount = yield* Stream.make(sealed).pipe(
          service.open("acc_0000000000000000000000000c", OBJ),
          Stream.runCollect,
          Effect.either,
        )
        expect(Either.isLeft(wrongAccount) && wrongAccount.left._tag).toBe("DecryptFailed")
      }
    }).pipe(Effect.provide(TestLayer)),
  )

  it.effect("a stream's plaintext before a bad chunk is released, the bad chunk's never", () =>
    Effect.gen(function* () {
      const service = yield* SealStream
      const plain = randomBytes(64 * 3)
      const sealed = Buffer.concat(
        Chunk.toArray(yield* Stream.make(plain).pipe(service.seal(ACC, OBJ, 64), Stream.runCollect)),
      )
      sealed[HEADER_BYTES + (64 + TAG) + 3]! ^= 1 // inside chunk 1
      const seen: Array<Uint8Array> = []
      // One byte per stream chunk: verified chunks flow out before the stream reaches the bad one.
      const result = yield* Stream.fromIterable(Array.from(sealed, (b) => Uint8Array.of(b))).pipe(
        Stream.rechunk(1),
        service.open(ACC, OBJ),
        Stream.runForEach((b) => Effect.sync(() => seen.push(b))),
        Effect.either,
      )
      expect(Either.isLeft(result) && result.left.reason).toMatch(/chunk 1/)
      expect(Buffer.concat(seen).equals(plain.subarray(0, 64))).toBe(true)
    }).pipe(Effect.provide(TestLayer)),
  )

  it.effect("Node Transforms round-trip through pipeline() and fail with DecryptFailed", () =>
    Effect.gen(function* () {
      const service = yield* SealStream
      const plain = randomBytes(DEFAULT_CHUNK_SIZE * 3 + 77)
      const collect = (into: Array<Buffer>) =>
        new Writable({
          write(chunk: Buffer, _e, cb) {
            into.push(chunk)
            cb()
          },
        })
      const sealedParts: Array<Buffer> = []
      const sealT = yield* service.sealTransform(ACC, OBJ)
      yield* Effect.promise(() => pipeline(Readable.from(pieces(plain)), sealT, collect(sealedParts)))
      const sealed = Buffer.concat(sealedParts)
      const openedParts: Array<Buffer> = []
      const openT = yield* service.openTransform(ACC, OBJ)
      yield* Effect.promise(() => pipeline(Readable.from(pieces(sealed, 9)), openT, collect(openedParts)))
      expect(Buffer.concat(openedParts).equals(plain)).toBe(true)

      const truncated = sealed.subarray(0, sealed.byteLength - 5)
      const badT = yield* service.openTransform(ACC, OBJ)
      const error = yield* Effect.flip(
        Effect.tryPromise(() => pipeline(Readable.from([truncated]), badT, collect([]))),
      )
      expect(error.cause).toBeInstanceOf(DecryptFailed)
    }).pipe(Effect.provide(TestLayer)),
  )
})
