/**
 * Streaming encryption of objects of any size (inputs, outputs, logs, files in the object store).
 *
 * Format:
 *
 *   header  = magic "HGSO" (4) | version (1) | chunk size (4, big-endian) | salt (32)
 *   chunk_i = AES-256-GCM(plaintext_i) | tag (16)
 *
 * Every chunk but the last holds exactly `chunk size` plaintext bytes; the last holds 0 to
 * `chunk size` bytes (an empty object is one empty final chunk). The per-object key is
 * HKDF-SHA256(data key, salt, header and account and object id), with a fresh random salt per
 * object, so the deterministic nonce (the chunk index) never repeats under one key. Each chunk's
 * associated data is (account, object id, chunk index, final flag). Hence chunks swapped or
 * reordered, a truncated object (its last chunk was not sealed as final), an extended object (the
 * old final chunk is now in the middle), a flipped bit, another account and another object id all
 * fail with `DecryptFailed`, and the opener releases a chunk's plaintext only after its tag verified.
 *
 * Memory stays flat: a sealer or opener holds one chunk at most (it must see one byte past a full
 * chunk to know the chunk is not the last), and the Effect `Stream` and Node `Transform` forms are
 * pull-based / respect backpressure.
 */
import {
  createCipheriv,
  createDecipheriv,
  createHash,
  createSecretKey,
  hkdfSync,
  type KeyObject,
  randomBytes,
} from "node:crypto"
import { Transform } from "node:stream"
import { Chunk, Context, Effect, Layer, Stream } from "effect"
import {
  DecryptFailed,
  KEY_BYTES,
  lengthPrefixed,
  NONCE_BYTES,
  openValue,
  sealValue,
  TAG_BYTES,
} from "./Aead.ts"
import { Keyring, type KeyringError } from "./Keyring.ts"

export { DecryptFailed } from "./Aead.ts"

const MAGIC = Buffer.from("HGSO", "latin1")
const VERSION = 1
const SALT_BYTES = 32
/** Bytes of the header in front of every sealed object. */
export const HEADER_BYTES = MAGIC.byteLength + 1 + 4 + SALT_BYTES
/** Default plaintext bytes per chunk. */
export const DEFAULT_CHUNK_SIZE = 64 * 1024
/** Largest chunk size accepted in a header (bounds what an opener allocates). */
export const MAX_CHUNK_SIZE = 16 * 1024 * 1024

/** The size of the sealed form of `plainBytes` bytes: header plus one tag per chunk. */
export const sealedSize = (plainBytes: number, chunkSize = DEFAULT_CHUNK_SIZE): number =>
  HEADER_BYTES + plainBytes + TAG_BYTES * Math.max(1, Math.ceil(plainBytes / chunkSize))

/**
 * A synchronous seal or open state machine. `push` never keeps a reference to its input after it
 * returns (uWS body buffers may be reused), and returns the output bytes now available; `end`
 * returns the rest. Both throw `DecryptFailed` (opening only).
 */
export interface Machine {
  readonly push: (input: Uint8Array) => Array<Uint8Array>
  readonly end: () => Array<Uint8Array>
}

const objectKey = (dataKey: KeyObject, header: Uint8Array, account: string, objectId: string): KeyObject => {
  const salt = header.subarray(HEADER_BYTES - SALT_BYTES)
  // HKDF info is limited to 1024 bytes; a hash of the context keeps it short whatever the ids.
  const info = createHash("sha256")
    .update(
      lengthPrefixed("hangar/sealstream", header.subarray(0, HEADER_BYTES - SALT_BYTES), account, objectId),
    )
    .digest()
  const bytes = Buffer.from(hkdfSync("sha256", dataKey, salt, info, KEY_BYTES))
  const key = createSecretKey(bytes)
  bytes.fill(0)
  return key
}

// Per-chunk state: the nonce and the associated data are rewritten in place for each chunk.
class ChunkCrypto {
  private readonly nonce = Buffer.alloc(NONCE_BYTES)
  private readonly aad: Buffer
  private readonly aadTail: number
  index = 0

  constructor(
    private readonly key: KeyObject,
    account: string,
    objectId: string,
  ) {
    const prefix = lengthPrefixed(account, objectId)
    this.aad = Buffer.alloc(prefix.byteLength + 9)
    this.aad.set(prefix)
    this.aadTail = prefix.byteLength
  }

  private next(final: boolean) {
    // Index up to 2^53: far beyond any object (2^53 chunks of 64 KiB).
    const hi = Math.floor(this.index / 0x1_0000_0000)
    const lo = this.index >>> 0
    this.nonce.writeUInt32BE(hi, 4)
    this.nonce.writeUInt32BE(lo, 8)
    this.aad.writeUInt32BE(hi, this.aadTail)
    this.aad.writeUInt32BE(lo, this.aadTail + 4)
    this.aad[this.aadTail + 8] = final ? 1 : 0
    this.index += 1
  }

  seal(plain: Uint8Array, final: boolean): Uint8Array {
    this.next(final)
    const cipher = createCipheriv("aes-256-gcm", this.key, this.nonce, { authTagLength: TAG_BYTES })
    cipher.setAAD(this.aad)
    const body = cipher.update(plain)
    cipher.final()
    return Buffer.concat([body, cipher.getAuthTag()], body.byteLength + TAG_BYTES)
  }

  open(frame: Uint8Array, final: boolean, what: string): Uint8Array {
    if (frame.byteLength < TAG_BYTES) throw new DecryptFailed({ what, reason: "truncated chunk" })
    const index = this.index
    this.next(final)
    try {
      const decipher = createDecipheriv("aes-256-gcm", this.key, this.nonce, { authTagLength: TAG_BYTES })
      decipher.setAAD(this.aad)
      decipher.setAuthTag(frame.subarray(frame.byteLength - TAG_BYTES))
      const plain = decipher.update(frame.subarray(0, frame.byteLength - TAG_BYTES))
      decipher.final()
      return plain
    } catch {
      throw new DecryptFailed({
        what,
        reason: `chunk ${index}${final ? " (last)" : ""} failed authentication`,
      })
    }
  }
}

/** A sealer for one object: plaintext in, header and sealed chunks out. */
export const makeSealer = (
  dataKey: KeyObject,
  account: string,
  objectId: string,
  chunkSize: number = DEFAULT_CHUNK_SIZE,
): Machine => {
  if (!Number.isInteger(chunkSize) || chunkSize < 1 || chunkSize > MAX_CHUNK_SIZE) {
    throw new RangeError(`chunkSize must be an integer in 1..${MAX_CHUNK_SIZE}, got ${chunkSize}`)
  }
  const header = Buffer.alloc(HEADER_BYTES)
  MAGIC.copy(header, 0)
  header[MAGIC.byteLength] = VERSION
  header.writeUInt32BE(chunkSize, MAGIC.byteLength + 1)
  randomBytes(SALT_BYTES).copy(header, HEADER_BYTES - SALT_BYTES)
  const chunks = new ChunkCrypto(objectKey(dataKey, header, account, objectId), account, objectId)
  const buffer = Buffer.allocUnsafe(chunkSize)
  let fill = 0
  let headerSent = false
  let ended = false

  return {
    push: (input) => {
      if (ended) throw new Error("SealStream: push after end")
      const out: Array<Uint8Array> = []
      if (!headerSent) {
        out.push(header)
        headerSent = true
      }
      let at = 0
      while (at < input.byteLength) {
        // A full buffer with more bytes arriving is not the last chunk.
        if (fill === chunkSize) {
          out.push(chunks.seal(buffer, false))
          fill = 0
        }
        // Whole chunks straight from the input, without copying, while more bytes follow them.
        while (fill === 0 && input.byteLength - at > chunkSize) {
          out.push(chunks.seal(input.subarray(at, at + chunkSize), false))
          at += chunkSize
        }
        const n = Math.min(chunkSize - fill, input.byteLength - at)
        buffer.set(input.subarray(at, at + n), fill)
        fill += n
        at += n
      }
      return out
    },
    end: () => {
      if (ended) throw new Error("SealStream: end called twice")
      ended = true
      const out: Array<Uint8Array> = headerSent ? [] : [header]
      out.push(chunks.seal(buffer.subarray(0, fill), true))
      return out
    },
  }
}

/** An opener for one object: sealed bytes in, verified plaintext out; throws `DecryptFailed`. */
export const makeOpener = (dataKey: KeyObject, account: string, objectId: string): Machine => {
  const what = `object ${objectId}`
  const header = Buffer.alloc(HEADER_BYTES)
  let headerFill = 0
  let chunks: ChunkCrypto | undefined
  let frame = 0
  let buffer = Buffer.alloc(0)
  let fill = 0

  const start = () => {
    if (!header.subarray(0, MAGIC.byteLength).equals(MAGIC)) {
      throw new DecryptFailed({ what, reason: "not a sealed object (bad magic)" })
    }
    const version = header[MAGIC.byteLength]
    if (version !== VERSION) throw new DecryptFailed({ what, reason: `unknown version ${version}` })
    const chunkSize = header.readUInt32BE(MAGIC.byteLength + 1)
    if (chunkSize < 1 || chunkSize > MAX_CHUNK_SIZE) {
      throw new DecryptFailed({ what, reason: `chunk size ${chunkSize} out of range` })
    }
    frame = chunkSize + TAG_BYTES
    buffer = Buffer.allocUnsafe(frame)
    return new ChunkCrypto(objectKey(dataKey, header, account, objectId), account, objectId)
  }

  return {
    push: (input) => {
      const out: Array<Uint8Array> = []
      let at = 0
      if (chunks === undefined) {
        const n = Math.min(HEADER_BYTES - headerFill, input.byteLength)
        header.set(input.subarray(0, n), headerFill)
        headerFill += n
        at = n
        if (headerFill < HEADER_BYTES) return out
        chunks = start()
      }
      while (at < input.byteLength) {
        if (fill === frame) {
          out.push(chunks.open(buffer, false, what))
          fill = 0
        }
        while (fill === 0 && input.byteLength - at > frame) {
          out.push(chunks.open(input.subarray(at, at + frame), false, what))
          at += frame
        }
        const n = Math.min(frame - fill, input.byteLength - at)
        buffer.set(input.subarray(at, at + n), fill)
        fill += n
        at += n
      }
      return out
    },
    end: () => {
      if (chunks === undefined) throw new DecryptFailed({ what, reason: "truncated header" })
      return [chunks.open(buffer.subarray(0, fill), true, what)]
    },
  }
}

const toDecryptFailed = (what: string) => (error: unknown) =>
  error instanceof DecryptFailed ? error : new DecryptFailed({ what, reason: String(error) })

/**
 * Runs a stream through a machine made per run; a machine error ends the stream with
 * `DecryptFailed`. Elements are processed one at a time (not a whole input chunk at once, which
 * `Stream.fromIterable` makes up to 4096 elements long), so output is released as it is made.
 */
const through = <E, R>(
  self: Stream.Stream<Uint8Array, E, R>,
  machine: () => Machine,
  what: string,
): Stream.Stream<Uint8Array, E | DecryptFailed, R> =>
  Stream.suspend(() => {
    const m = machine()
    const attempt = (f: () => Array<Uint8Array>) =>
      Effect.try({ try: () => Chunk.unsafeFromArray(f()), catch: toDecryptFailed(what) })
    return self.pipe(
      Stream.mapConcatChunkEffect((piece) => attempt(() => m.push(piece))),
      Stream.concat(Stream.fromIterableEffect(attempt(m.end))),
    )
  })

/** Wraps a machine as a Node `Transform` (backpressure handled by Node; errors are `DecryptFailed`). */
export const toTransform = (machine: Machine, what: string): Transform =>
  new Transform({
    transform(piece: Buffer, _encoding, callback) {
      try {
        for (const out of machine.push(piece)) this.push(out)
        callback()
      } catch (error) {
        callback(toDecryptFailed(what)(error))
      }
    },
    flush(callback) {
      try {
        for (const out of machine.end()) this.push(out)
        callback()
      } catch (error) {
        callback(toDecryptFailed(what)(error))
      }
    },
  })

/**
 * Pieces of one object sealed one by one, each readable alone (a command's output chunks, stored as
 * separate messages and read from any offset): the object's key is HKDF-SHA256(data key, info =
 * account and object id) and each piece is a sealed value (`Aead.sealValue`: random nonce, so a
 * piece sealed again after a restart never reuses one) whose associated data is (account, object
 * id, the piece's position). A piece opened at another position, of another object or account, or
 * altered, fails with `DecryptFailed`. Each piece costs `OVERHEAD` bytes.
 */
export interface PieceSealer {
  readonly seal: (position: number, plaintext: Uint8Array) => Uint8Array
  readonly open: (position: number, sealed: Uint8Array) => Uint8Array | DecryptFailed
}

/** The piece sealer of an object, given the account's data key. */
export const pieceSealer = (dataKey: KeyObject, account: string, objectId: string): PieceSealer => {
  const context = lengthPrefixed("hangar/pieces/v1", account, objectId)
  // Derived at the first piece: most commands print nothing, and a sink is made for each one.
  let derived: KeyObject | undefined
  const keyOf = (): KeyObject => {
    if (derived !== undefined) return derived
    const bytes = Buffer.from(
      hkdfSync("sha256", dataKey, Buffer.alloc(0), createHash("sha256").update(context).digest(), KEY_BYTES),
    )
    derived = createSecretKey(bytes)
    bytes.fill(0)
    return derived
  }
  const aadOf = (position: number) => {
    const aad = Buffer.alloc(context.byteLength + 8)
    aad.set(context)
    aad.writeBigUInt64BE(BigInt(position), context.byteLength)
    return aad
  }
  const what = `piece of ${objectId}`
  return {
    seal: (position, plaintext) => sealValue(keyOf(), aadOf(position), plaintext),
    open: (position, sealed) => openValue(keyOf(), aadOf(position), sealed, what),
  }
}

/** What streaming encryption offers; every method fetches the account's data key from the keyring. */
export interface SealStreamService {
  /** The piece sealer of one object. */
  readonly pieces: (account: string, objectId: string) => Effect.Effect<PieceSealer, KeyringError>
  /** A sealer for one object (for callers that drive bytes by hand, e.g. a uWS `onData`). */
  readonly sealer: (
    account: string,
    objectId: string,
    chunkSize?: number,
  ) => Effect.Effect<Machine, KeyringError>
  /** An opener for one object. */
  readonly opener: (account: string, objectId: string) => Effect.Effect<Machine, KeyringError>
  /** Plaintext stream → sealed stream; each run of the result seals anew (fresh salt). */
  readonly seal: (
    account: string,
    objectId: string,
    chunkSize?: number,
  ) => <E, R>(self: Stream.Stream<Uint8Array, E, R>) => Stream.Stream<Uint8Array, E | KeyringError, R>
  /** Sealed stream → plaintext stream; fails with `DecryptFailed` at the first chunk that does not verify. */
  readonly open: (
    account: string,
    objectId: string,
  ) => <E, R>(
    self: Stream.Stream<Uint8Array, E, R>,
  ) => Stream.Stream<Uint8Array, E | KeyringError | DecryptFailed, R>
  /** A Node `Transform` sealing one object. */
  readonly sealTransform: (
    account: string,
    objectId: string,
    chunkSize?: number,
  ) => Effect.Effect<Transform, KeyringError>
  /** A Node `Transform` opening one object; it errors with `DecryptFailed`. */
  readonly openTransform: (account: string, objectId: string) => Effect.Effect<Transform, KeyringError>
}

/** The streaming encryption service. */
export class SealStream extends Context.Tag("hangar/SealStream")<SealStream, SealStreamService>() {}

/** Builds the service over the keyring. */
export const make = Effect.gen(function* () {
  const keyring = yield* Keyring
  const sealer = (account: string, objectId: string, chunkSize?: number) =>
    keyring.dataKey(account).pipe(Effect.map((key) => makeSealer(key, account, objectId, chunkSize)))
  const opener = (account: string, objectId: string) =>
    keyring.dataKey(account).pipe(Effect.map((key) => makeOpener(key, account, objectId)))
  return {
    pieces: (account, objectId) =>
      keyring.dataKey(account).pipe(Effect.map((key) => pieceSealer(key, account, objectId))),
    sealer,
    opener,
    seal:
      (account, objectId, chunkSize) =>
      <E, R>(self: Stream.Stream<Uint8Array, E, R>) =>
        Stream.unwrap(
          keyring
            .dataKey(account)
            .pipe(
              Effect.map((key) =>
                through(self, () => makeSealer(key, account, objectId, chunkSize), `object ${objectId}`),
              ),
            ),
        ),
    open:
      (account, objectId) =>
      <E, R>(self: Stream.Stream<Uint8Array, E, R>) =>
        Stream.unwrap(
          keyring
            .dataKey(account)
            .pipe(
              Effect.map((key) =>
                through(self, () => makeOpener(key, account, objectId), `object ${objectId}`),
              ),
            ),
        ),
    sealTransform: (account, objectId, chunkSize) =>
      sealer(account, objectId, chunkSize).pipe(Effect.map((m) => toTransform(m, `object ${objectId}`))),
    openTransform: (account, objectId) =>
      opener(account, objectId).pipe(Effect.map((m) => toTransform(m, `object ${objectId}`))),
  } satisfies SealStreamService
})

/** The service as a layer; needs `Keyring`. */
export const layer = Layer.effect(SealStream, make)
