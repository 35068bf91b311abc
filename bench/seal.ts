// Throughput of streaming seal + open (core/SealStream.ts) beside raw AES-256-GCM over the same
// bytes, as figures (no assertions). Run: node --import tsx bench/seal.ts [MiB, default 256]
//
// The input is a 16 MiB random pool read as 256 KiB pieces (subarrays, no copying), so the figures
// measure encryption and framing, not the random generator.
import { createCipheriv, createDecipheriv, createSecretKey, randomBytes } from "node:crypto"
import { Readable, Writable } from "node:stream"
import { pipeline } from "node:stream/promises"
import { Effect, Layer, Stream } from "effect"
import * as Keyring from "../core/Keyring.ts"
import * as MasterKey from "../core/MasterKey.ts"
import {
  DEFAULT_CHUNK_SIZE,
  makeOpener,
  makeSealer,
  SealStream,
  layer as sealStreamLayer,
} from "../core/SealStream.ts"
import * as WrappedKeyStore from "../core/WrappedKeyStore.ts"

const MIB = 1024 * 1024
const total = Number(process.argv[2] ?? 256) * MIB
const PIECE = 256 * 1024
const pool = randomBytes(16 * MIB)
const ACC = "acc_0000000000000000000000000a"
const OBJ = "file_0000000000000000000000000a"

function* pieces(): Generator<Buffer> {
  for (let sent = 0; sent < total; sent += PIECE) {
    const at = sent % pool.byteLength
    yield pool.subarray(at, at + Math.min(PIECE, total - sent))
  }
}

const measure = async (label: string, passes: number, run: () => Promise<number> | number) => {
  const start = process.hrtime.bigint()
  const bytes = await run()
  const seconds = Number(process.hrtime.bigint() - start) / 1e9
  if (bytes !== total) throw new Error(`${label}: processed ${bytes} bytes, expected ${total}`)
  const mbs = (total * passes) / MIB / seconds
  console.log(
    `${label.padEnd(52)} ${mbs.toFixed(0).padStart(6)} MiB/s  (${passes} pass${passes > 1 ? "es" : ""}, ${seconds.toFixed(2)} s)`,
  )
}

const key = createSecretKey(randomBytes(32))
const nonce = randomBytes(12)

await measure("raw GCM, one cipher, encrypt only", 1, () => {
  const c = createCipheriv("aes-256-gcm", key, nonce)
  let n = 0
  for (const p of pieces()) n += c.update(p).byteLength
  c.final()
  return n
})

await measure("raw GCM, one cipher each way (encrypt + decrypt)", 2, () => {
  const c = createCipheriv("aes-256-gcm", key, nonce)
  const d = createDecipheriv("aes-256-gcm", key, nonce)
  let n = 0
  for (const p of pieces()) n += d.update(c.update(p)).byteLength
  c.final()
  return n
})

await measure(`raw GCM, new cipher per ${DEFAULT_CHUNK_SIZE / 1024} KiB chunk, encrypt + decrypt`, 2, () => {
  let n = 0
  for (const p of pieces()) {
    for (let at = 0; at < p.byteLength; at += DEFAULT_CHUNK_SIZE) {
      const chunk = p.subarray(at, at + DEFAULT_CHUNK_SIZE)
      const c = createCipheriv("aes-256-gcm", key, nonce)
      const sealed = c.update(chunk)
      c.final()
      const d = createDecipheriv("aes-256-gcm", key, nonce)
      d.setAuthTag(c.getAuthTag())
      n += d.update(sealed).byteLength
      d.final()
    }
  }
  return n
})

await measure("SealStream machines (seal + open, synchronous)", 2, () => {
  const sealer = makeSealer(key, ACC, OBJ)
  const opener = makeOpener(key, ACC, OBJ)
  let n = 0
  for (const p of pieces()) for (const s of sealer.push(p)) for (const o of opener.push(s)) n += o.byteLength
  for (const s of sealer.end()) for (const o of opener.push(s)) n += o.byteLength
  for (const o of opener.end()) n += o.byteLength
  return n
})

const TestLayer = sealStreamLayer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
)
const service = await Effect.runPromise(SealStream.pipe(Effect.provide(TestLayer)))

await measure("SealStream Effect Stream (seal + open)", 2, () =>
  Effect.runPromise(
    Stream.fromIterable(pieces()).pipe(
      service.seal(ACC, OBJ),
      service.open(ACC, OBJ),
      Stream.runFold(0, (n, b) => n + b.byteLength),
    ),
  ),
)

await measure("SealStream Node Transform pipeline (seal + open)", 2, async () => {
  let n = 0
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      n += chunk.byteLength
      callback()
    },
  })
  const sealT = await Effect.runPromise(service.sealTransform(ACC, OBJ))
  const openT = await Effect.runPromise(service.openTransform(ACC, OBJ))
  await pipeline(Readable.from(pieces()), sealT, openT, sink)
  return n
})
