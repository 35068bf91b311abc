/**
 * Reading a command's output back out of the `OUTPUT` stream (`out.<run>.<cmd>`), for the host
 * agent and the gateway alike (the host agent's `OutputSink` writes it; see there for the message
 * layout: chunks carry their byte offset in `Hangar-Offset`, a payload-free marker with
 * `Hangar-Done: 1` records the totals when the command ended). Each chunk is sealed for the run's
 * account (`SealStream.pieces` of `outputObject(run, cmd)` at the chunk's offset) and opened here.
 *
 * The reader pages by byte offset: the chunk holding the offset is found by a binary search over
 * stream sequences (offsets grow with sequence), then the window is read in order.
 *
 * A long poll waits with `awaitOutputAfter`: an ordered consumer started one past the last stream
 * sequence the read saw, so a chunk stored between the read and the wait is not missed, and the
 * wait ends as soon as the stream holds anything newer (no polling).
 */
import { DeliverPolicy } from "@nats-io/jetstream"
import { Effect, Option, Stream } from "effect"
import type { CommandOutput } from "../schema/Command.ts"
import { DecryptFailed, OVERHEAD } from "./Aead.ts"
import type { KeyringError } from "./Keyring.ts"
import { attempt, Nats, NatsError } from "./Nats.ts"
import { SealStream } from "./SealStream.ts"
import { Storage } from "./Storage.ts"
import { dropConsumer, getMessage, readSubject, type StoredMessage } from "./StreamRead.ts"

/** Most output bytes one read returns: 512 KiB. */
export const READ_MAX_BYTES = 512 * 1024

/** Header names of output messages. */
export const outputHeaders = {
  /** Byte offset of the message's first byte in the command's output. */
  offset: "Hangar-Offset",
  /** Output bytes the command had written when the message was published. */
  outputBytes: "Hangar-Output-Bytes",
  /** `1` on the marker published when the command ended. */
  done: "Hangar-Done",
  /** On the marker: bytes kept in the stream. */
  storedBytes: "Hangar-Stored-Bytes",
  /** `1` on a chunk sealed for the account; chunks stored before output was sealed have none. */
  sealed: "Hangar-Sealed",
} as const

/** The sealed object a command's output chunks are pieces of. */
export const outputObject = (run: string, cmd: string): string => `output/${run}/${cmd}`

const offsetOf = (m: StoredMessage) => Number(m.header(outputHeaders.offset) ?? 0)
const isSealed = (m: StoredMessage) => m.header(outputHeaders.sealed) === "1"
/** Output bytes a message holds: a chunk's bytes (less the seal's when sealed); the marker holds none. */
const bytesOf = (m: StoredMessage) =>
  m.header(outputHeaders.done) === "1"
    ? 0
    : isSealed(m)
      ? Math.max(0, m.data.length - OVERHEAD)
      : m.data.length

/**
 * How many bytes at the end of `bytes` are the start of a multibyte character whose rest is not
 * there (0 when it ends on a whole character, or on bytes that are not UTF-8 anyway).
 */
export const incompleteTail = (bytes: Uint8Array): number => {
  const n = bytes.length
  for (let k = 1; k <= Math.min(3, n); k++) {
    const b = bytes[n - k] as number
    if ((b & 0xc0) === 0x80) continue
    const need = b >= 0xf0 && b <= 0xf4 ? 4 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xc2 && b <= 0xdf ? 2 : 1
    return need > k ? k : 0
  }
  return 0
}

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true })

/** A read, and the stream sequence of the command's last stored message (0 when it has none). */
export interface OutputRead {
  readonly output: CommandOutput
  readonly lastSeq: number
}

/**
 * As {@link readOutput}, also answering the stream sequence the read saw last, which is where a
 * wait for more (`awaitOutputAfter`) starts.
 */
export const readOutputAt = (
  account: string,
  run: string,
  cmd: string,
  after: number,
  maxBytes: number = READ_MAX_BYTES,
): Effect.Effect<OutputRead, NatsError | KeyringError | DecryptFailed, Nats | Storage | SealStream> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const stream = names.streams.OUTPUT.name
    const subject = names.subjects.output(run, cmd)
    // Below 4 bytes a window could hold no whole character and never move on.
    const limit = Math.max(4, Math.min(maxBytes, READ_MAX_BYTES))

    const lastFound = yield* getMessage(stream, { lastOf: subject })
    if (Option.isNone(lastFound))
      return {
        output: { output: "", next: after, output_bytes: 0, stored_bytes: 0, done: false },
        lastSeq: 0,
      }
    const last = lastFound.value
    const ended = last.header(outputHeaders.done) === "1"
    const storedEnd = offsetOf(last) + bytesOf(last)
    const output_bytes = Number(last.header(outputHeaders.outputBytes) ?? storedEnd)
    const stored_bytes = ended ? Number(last.header(outputHeaders.storedBytes) ?? storedEnd) : storedEnd
    if (after >= storedEnd)
      return {
        output: { output: "", next: after, output_bytes, stored_bytes, done: ended },
        lastSeq: last.seq,
      }

    // The last message whose offset is at most `after` holds it (offsets grow with sequence).
    const first = yield* getMessage(stream, { nextOf: subject, seq: 1 })
    let lo = Option.isSome(first) ? first.value.seq : last.seq
    let hi = last.seq
    while (lo < hi) {
      const mid = Math.floor((lo + hi + 1) / 2)
      const probe = yield* getMessage(stream, { nextOf: subject, seq: mid })
      if (Option.isSome(probe) && offsetOf(probe.value) <= after) lo = probe.value.seq
      else hi = mid - 1
    }

    const end = Math.min(after + limit, storedEnd)
    const window = Buffer.alloc(end - after)
    const pieces = yield* Effect.flatMap(SealStream, (seal) => seal.pieces(account, outputObject(run, cmd)))
    yield* readSubject(stream, subject, lo, last.seq).pipe(
      Stream.takeUntil((m) => offsetOf(m) + bytesOf(m) >= end),
      Stream.runForEach((m) => {
        const at = offsetOf(m)
        const from = Math.max(after, at)
        const to = Math.min(end, at + bytesOf(m))
        if (to <= from) return Effect.void
        const plain = isSealed(m) ? pieces.open(at, m.data) : m.data
        if (plain instanceof DecryptFailed) return Effect.fail(plain)
        window.set(plain.subarray(from - at, to - at), from - after)
        return Effect.void
      }),
    )
    // More bytes follow (now or later): do not return the first part of a character.
    const moreToCome = end < storedEnd || !ended
    const tail = moreToCome ? incompleteTail(window) : 0
    const bytes = window.subarray(0, window.length - tail)
    const next = after + bytes.length
    return {
      output: {
        output: decoder.decode(bytes),
        next,
        output_bytes,
        stored_bytes,
        done: ended && next >= stored_bytes,
      },
      lastSeq: last.seq,
    }
  })

/**
 * Reads command `cmd`'s kept output from byte offset `after`: at most `maxBytes` (512 KiB) bytes,
 * ending on a whole UTF-8 character unless the kept output itself ends inside one; bytes that are
 * not UTF-8 (or a window starting inside a character) read as U+FFFD. `next` is the byte offset
 * after the bytes returned; `done` once the command ended and everything kept was read.
 */
export const readOutput = (
  account: string,
  run: string,
  cmd: string,
  after: number,
  maxBytes: number = READ_MAX_BYTES,
): Effect.Effect<CommandOutput, NatsError | KeyringError | DecryptFailed, Nats | Storage | SealStream> =>
  Effect.map(readOutputAt(account, run, cmd, after, maxBytes), (r) => r.output)

/**
 * Completes once the stream holds a message of command `cmd` after stream sequence `afterSeq`
 * (a chunk or the done marker); waits as long as it takes, so callers bound it with a timeout.
 * Interrupting it stops its consumer (the server removes the idle ordered consumer).
 */
export const awaitOutputAfter = (
  run: string,
  cmd: string,
  afterSeq: number,
): Effect.Effect<void, NatsError, Nats | Storage> =>
  Effect.scoped(
    Effect.gen(function* () {
      const { names } = yield* Storage
      const { js } = yield* Nats
      const stream = names.streams.OUTPUT.name
      const consumer = yield* attempt(`consumer.ordered ${stream}`, () =>
        js.consumers.get(stream, {
          filter_subjects: names.subjects.output(run, cmd),
          deliver_policy: DeliverPolicy.StartSequence,
          opt_start_seq: afterSeq + 1,
        }),
      )
      const messages = yield* Effect.acquireRelease(
        attempt(`consume ${stream}`, () => consumer.consume({ max_messages: 1 })),
        // `stop`, not `close`: close waits for the iterator to be read to its end.
        (m) =>
          Effect.zipRight(
            Effect.sync(() => m.stop()),
            dropConsumer(consumer),
          ),
      )
      // Not `Stream.fromAsyncIterable`, whose release awaits the pending `next()` (see Consumer.ts).
      const iterator = messages[Symbol.asyncIterator]()
      yield* Effect.tryPromise({
        try: () => iterator.next(),
        catch: (cause) =>
          new NatsError({
            operation: `consume ${stream}`,
            message: cause instanceof Error ? cause.message : String(cause),
            cause,
          }),
      })
    }),
  )
