/**
 * A command's output on its way into the `OUTPUT` stream (`out.<run>.<cmd>`), and back out.
 *
 * The sink keeps the first 4 MiB of a command's output (cut exactly there, even inside a
 * character) and counts the rest. Small writes are gathered into chunks of about 64 KiB, or
 * whatever came in the last 50 ms, so a command printing a byte at a time does not become a
 * message per byte. Every chunk carries its byte offset, and its `Nats-Msg-Id` is
 * `<cmd>:<offset>`, so a retried publish is stored once. When the command ends a marker message
 * (`Hangar-Done: 1`, no payload) records the totals.
 *
 * The reader pages by byte offset: the chunk holding the offset is found by a binary search over
 * stream sequences (offsets grow with sequence), then the window is read in order.
 */
import type { Scope } from "effect"
import { Deferred, Effect, Option, Queue, Schedule, Stream } from "effect"
import type { Nats, NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import { publish } from "../../core/Stream.ts"
import { getMessage, readSubject, type StoredMessage } from "../../core/StreamRead.ts"
import type { CommandOutput } from "../../schema/Command.ts"

/** Output bytes of one command kept in the stream: the first 4 MiB. */
export const KEEP_BYTES = 4 * 1024 * 1024
/** Most output bytes one read returns: 512 KiB. */
export const READ_MAX_BYTES = 512 * 1024
/** A chunk is published once this many bytes are pending. */
export const FLUSH_BYTES = 64 * 1024
/** Pending bytes are published at least this often. */
export const FLUSH_MS = 50

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
} as const

/** The totals of a command's output. */
export interface OutputTotals {
  /** Every byte the command wrote. */
  readonly output_bytes: number
  /** The bytes kept in the stream (at most `KEEP_BYTES`). */
  readonly stored_bytes: number
}

/** One command's output sink. */
export interface OutputSink {
  /** Takes output bytes as they come (synchronous, for stream callbacks); bytes past 4 MiB are only counted. */
  readonly write: (chunk: Uint8Array) => void
  /** Publishes what is pending and the done marker; waits until all is stored. Call once, when the command ended. */
  readonly finish: Effect.Effect<OutputTotals, NatsError>
  /** The totals so far. */
  readonly totals: () => OutputTotals
}

/** Tuning of a sink (tests use smaller values). */
export interface SinkOptions {
  readonly keepBytes?: number
  readonly flushBytes?: number
  readonly flushMs?: number
}

const retryPolicy = Schedule.exponential("50 millis").pipe(Schedule.intersect(Schedule.recurs(6)))

/**
 * Publishes one output chunk at `offset`; idempotent: the same `(cmd, offset)` within the stream's
 * duplicate window is stored once.
 */
export const publishChunk = (
  subject: string,
  cmd: string,
  offset: number,
  data: Uint8Array,
  outputBytes: number,
) =>
  publish(subject, data, {
    msgId: `${cmd}:${offset}`,
    headers: { [outputHeaders.offset]: String(offset), [outputHeaders.outputBytes]: String(outputBytes) },
  })

/** Publishes the done marker of a command (idempotent like `publishChunk`). */
export const publishDone = (subject: string, cmd: string, totals: OutputTotals) =>
  publish(subject, new Uint8Array(0), {
    msgId: `${cmd}:done`,
    headers: {
      [outputHeaders.offset]: String(totals.stored_bytes),
      [outputHeaders.outputBytes]: String(totals.output_bytes),
      [outputHeaders.done]: "1",
      [outputHeaders.storedBytes]: String(totals.stored_bytes),
    },
  })

type Piece =
  | {
      readonly _tag: "chunk"
      readonly offset: number
      readonly data: Uint8Array
      readonly outputBytes: number
    }
  | { readonly _tag: "done"; readonly totals: OutputTotals }

/**
 * A sink for command `cmd` of run `run`. Chunks are published in order by one fiber of the scope;
 * closing the scope before `finish` drops what was not yet published (no done marker).
 */
export const make = (
  run: string,
  cmd: string,
  options: SinkOptions = {},
): Effect.Effect<OutputSink, never, Nats | Storage | Scope.Scope> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const subject = names.subjects.output(run, cmd)
    const keep = options.keepBytes ?? KEEP_BYTES
    const flushBytes = options.flushBytes ?? FLUSH_BYTES
    const flushMs = options.flushMs ?? FLUSH_MS

    // Memory is bounded by `keep`: nothing past it is queued.
    const queue = yield* Queue.unbounded<Piece>()
    const ended = yield* Deferred.make<OutputTotals, NatsError>()
    let outputBytes = 0
    let accepted = 0
    let flushed = 0
    let pending: Array<Uint8Array> = []
    let pendingBytes = 0
    let finishing = false

    const flush = () => {
      if (pendingBytes === 0) return
      const data = pending.length === 1 ? (pending[0] as Uint8Array) : Buffer.concat(pending)
      queue.unsafeOffer({ _tag: "chunk", offset: flushed, data, outputBytes })
      flushed += data.length
      pending = []
      pendingBytes = 0
    }

    const write = (chunk: Uint8Array) => {
      outputBytes += chunk.length
      const room = keep - accepted
      if (room <= 0 || finishing) return
      // A copy: the caller may reuse its buffer.
      const piece = Uint8Array.prototype.slice.call(chunk, 0, Math.min(room, chunk.length))
      pending.push(piece)
      pendingBytes += piece.length
      accepted += piece.length
      if (pendingBytes >= flushBytes) flush()
    }

    const totals = () => ({ output_bytes: outputBytes, stored_bytes: accepted })

    // One publisher, one message at a time: the stream holds the chunks in offset order.
    yield* Effect.gen(function* () {
      for (;;) {
        const piece = yield* Queue.take(queue)
        if (piece._tag === "chunk") {
          yield* publishChunk(subject, cmd, piece.offset, piece.data, piece.outputBytes).pipe(
            Effect.retry(retryPolicy),
          )
        } else {
          yield* publishDone(subject, cmd, piece.totals).pipe(Effect.retry(retryPolicy))
          yield* Deferred.succeed(ended, piece.totals)
          return
        }
      }
    }).pipe(
      Effect.catchAll((e) => Deferred.fail(ended, e)),
      Effect.forkScoped,
    )

    yield* Effect.sync(flush).pipe(Effect.repeat(Schedule.spaced(flushMs)), Effect.forkScoped)

    const finish = Effect.suspend(() => {
      if (!finishing) {
        finishing = true
        flush()
        queue.unsafeOffer({ _tag: "done", totals: totals() })
      }
      return Deferred.await(ended)
    })

    return { write, finish, totals } satisfies OutputSink
  })

// ---------------------------------------------------------------------------------------------
// Reading

const offsetOf = (m: StoredMessage) => Number(m.header(outputHeaders.offset) ?? 0)

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

/**
 * Reads command `cmd`'s kept output from byte offset `after`: at most `maxBytes` (512 KiB) bytes,
 * ending on a whole UTF-8 character unless the kept output itself ends inside one; bytes that are
 * not UTF-8 (or a window starting inside a character) read as U+FFFD. `next` is the byte offset
 * after the bytes returned; `done` once the command ended and everything kept was read.
 */
export const readOutput = (
  run: string,
  cmd: string,
  after: number,
  maxBytes: number = READ_MAX_BYTES,
): Effect.Effect<CommandOutput, NatsError, Nats | Storage> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const stream = names.streams.OUTPUT.name
    const subject = names.subjects.output(run, cmd)
    // Below 4 bytes a window could hold no whole character and never move on.
    const limit = Math.max(4, Math.min(maxBytes, READ_MAX_BYTES))

    const lastFound = yield* getMessage(stream, { lastOf: subject })
    if (Option.isNone(lastFound))
      return { output: "", next: after, output_bytes: 0, stored_bytes: 0, done: false }
    const last = lastFound.value
    const ended = last.header(outputHeaders.done) === "1"
    const storedEnd = offsetOf(last) + last.data.length
    const output_bytes = Number(last.header(outputHeaders.outputBytes) ?? storedEnd)
    const stored_bytes = ended ? Number(last.header(outputHeaders.storedBytes) ?? storedEnd) : storedEnd
    if (after >= storedEnd) return { output: "", next: after, output_bytes, stored_bytes, done: ended }

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
    yield* readSubject(stream, subject, lo, last.seq).pipe(
      Stream.takeUntil((m) => offsetOf(m) + m.data.length >= end),
      Stream.runForEach((m) =>
        Effect.sync(() => {
          const at = offsetOf(m)
          const from = Math.max(after, at)
          const to = Math.min(end, at + m.data.length)
          if (to > from) window.set(m.data.subarray(from - at, to - at), from - after)
        }),
      ),
    )
    // More bytes follow (now or later): do not return the first part of a character.
    const moreToCome = end < storedEnd || !ended
    const tail = moreToCome ? incompleteTail(window) : 0
    const bytes = window.subarray(0, window.length - tail)
    const next = after + bytes.length
    return {
      output: decoder.decode(bytes),
      next,
      output_bytes,
      stored_bytes,
      done: ended && next >= stored_bytes,
    }
  })
