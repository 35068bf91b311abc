/**
 * A command's output on its way into the `OUTPUT` stream (`out.<run>.<cmd>`), and back out.
 *
 * The sink keeps the first 4 MiB of a command's output (cut exactly there, even inside a
 * character) and counts the rest. Small writes are gathered into chunks of about 64 KiB, or
 * whatever came in the last 50 ms, so a command printing a byte at a time does not become a
 * message per byte. Every chunk carries its byte offset, and its `Nats-Msg-Id` is
 * `<cmd>:<offset>`, so a retried publish is stored once. When a command that wrote anything ends, a
 * marker message (`Hangar-Done: 1`, no payload) records the totals; a command that wrote nothing
 * (most of them) stores no message at all. The command's end waits for its chunks, not for the
 * marker: readers take a command whose record has ended and whose stored bytes were all read as
 * done, and its byte count from the record (the gateway's output route).
 *
 * Each chunk is sealed for the run's account on its own (`SealStream.pieces`, the object
 * `outputObject(run, cmd)`, the chunk's offset as its position; header `Hangar-Sealed: 1`), so a
 * reader opens any chunk alone and the `OUTPUT` stream holds no output in clear. (The head and tail
 * of the output in the command's `bash` result are in its record, which the store's own encryption
 * protects: ARCHITECTURE.md, "Encryption at rest".)
 *
 * Reading it back (`readOutput`) lives in `core/CommandOutput.ts`, shared with the gateway, and is
 * re-exported here.
 */
import { Deferred, Effect, Exit, Fiber, FiberId, Queue, Runtime, Schedule, type Scope } from "effect"
import { outputHeaders, outputObject } from "../../core/CommandOutput.ts"
import type { KeyringError } from "../../core/Keyring.ts"
import type { Nats, NatsError } from "../../core/Nats.ts"
import { SealStream } from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import { publish } from "../../core/Stream.ts"

export { outputHeaders, outputObject, READ_MAX_BYTES } from "../../core/CommandOutput.ts"

/** Output bytes of one command kept in the stream: the first 4 MiB. */
export const KEEP_BYTES = 4 * 1024 * 1024
/** A chunk is published once this many bytes are pending. */
export const FLUSH_BYTES = 64 * 1024
/** Pending bytes are published at least this often. */
export const FLUSH_MS = 50

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
  /**
   * Publishes what is pending and waits until every chunk is stored; the done marker (none when
   * nothing was written) follows without being waited for (`marked`), so the command's end is not
   * held up by it. Call when the command ended; calling again answers the same.
   */
  readonly finish: Effect.Effect<OutputTotals, NatsError>
  /** Completes once the done marker is stored, or at `finish` when there is none. */
  readonly marked: Effect.Effect<void, NatsError>
  /** The totals so far. */
  readonly totals: () => OutputTotals
  /** Stops the timer and the publisher: before `finish`, what was not yet published is dropped (no done marker). */
  readonly close: Effect.Effect<void>
}

/** Tuning of a sink (tests use smaller values). */
export interface SinkOptions {
  readonly keepBytes?: number
  readonly flushBytes?: number
  readonly flushMs?: number
}

const retryPolicy = Schedule.exponential("50 millis").pipe(Schedule.intersect(Schedule.recurs(6)))

/**
 * Publishes one sealed output chunk at `offset`; idempotent: the same `(cmd, offset)` within the stream's
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
    headers: {
      [outputHeaders.offset]: String(offset),
      [outputHeaders.outputBytes]: String(outputBytes),
      [outputHeaders.sealed]: "1",
    },
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

/** The publishing side of a sink, made by its first chunk (or a marker for output past what is kept). */
interface Publishing {
  readonly queue: Queue.Queue<Piece>
  /** Every chunk stored; then the marker stored (`marked`). */
  readonly ended: Deferred.Deferred<OutputTotals, NatsError>
  readonly fiber: Fiber.RuntimeFiber<void>
}

/**
 * A sink for command `cmd` of run `run` of `account`. Chunks are published in order by one fiber,
 * started by the first chunk. Most commands print little or nothing, and one sink is made per
 * command on its way to the machine: one with no output makes no queue, no fiber and publishes
 * nothing (what that costs was measured on the command round trip, `bench/runs.ts`). Closing it
 * (`close`) before `finish` drops what was not yet published (no done marker). Not scoped: a scope
 * made and closed per command cost about 50 fiber steps on the round trip (`make` is the scoped form).
 */
export const open = (
  account: string,
  run: string,
  cmd: string,
  options: SinkOptions = {},
): Effect.Effect<OutputSink, KeyringError, Nats | Storage | SealStream> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const pieces = yield* Effect.flatMap(SealStream, (seal) => seal.pieces(account, outputObject(run, cmd)))
    const runtime = yield* Effect.runtime<Nats>()
    // Interruptible whatever the opener's region was: a sink opened as a resource (`acquireUseRelease`,
    // which acquires uninterruptibly) would otherwise get a publisher `close` could never stop.
    const fork = <A, E>(effect: Effect.Effect<A, E, Nats>) =>
      Runtime.runFork(runtime)(Effect.interruptible(effect))
    const subject = names.subjects.output(run, cmd)
    const keep = options.keepBytes ?? KEEP_BYTES
    const flushBytes = options.flushBytes ?? FLUSH_BYTES
    const flushMs = options.flushMs ?? FLUSH_MS

    let outputBytes = 0
    let accepted = 0
    let flushed = 0
    // Memory is bounded by `keep`: nothing past it is queued.
    let pending: Array<Uint8Array> = []
    let pendingBytes = 0
    let finishing = false
    let publishing: Publishing | undefined
    // Completed when the marker is stored, or at `finish` when there is none; made when asked for.
    let marked: Deferred.Deferred<void, NatsError> | undefined
    let markedExit: Exit.Exit<void, NatsError> | undefined
    const settleMarked = (exit: Exit.Exit<void, NatsError>) => {
      markedExit = exit
      if (marked !== undefined) Deferred.unsafeDone(marked, exit)
    }
    // Pending bytes wait at most `flushMs` before they are queued.
    let timer: ReturnType<typeof setTimeout> | undefined

    const publishMarker = (totals: OutputTotals) =>
      publishDone(subject, cmd, totals).pipe(
        Effect.retry(retryPolicy),
        Effect.asVoid,
        Effect.tapError((e) =>
          Effect.logWarning("command output marker not stored", e).pipe(
            Effect.annotateLogs({ run, command: cmd }),
          ),
        ),
        Effect.exit,
        Effect.flatMap((exit) => Effect.sync(() => settleMarked(exit))),
      )

    // One publisher, one message at a time: the stream holds the chunks in offset order, and the
    // marker after them.
    const start = (): Publishing => {
      if (publishing !== undefined) return publishing
      const queue = Effect.runSync(Queue.unbounded<Piece>())
      const ended = Deferred.unsafeMake<OutputTotals, NatsError>(FiberId.none)
      const publishAll = Effect.gen(function* () {
        for (;;) {
          const piece = yield* Queue.take(queue)
          if (piece._tag === "chunk") {
            yield* publishChunk(subject, cmd, piece.offset, piece.data, piece.outputBytes).pipe(
              Effect.retry(retryPolicy),
            )
          } else {
            yield* Deferred.succeed(ended, piece.totals)
            yield* publishMarker(piece.totals)
            return
          }
        }
      }).pipe(
        Effect.catchAll((e) =>
          Effect.zipRight(
            Deferred.fail(ended, e),
            Effect.sync(() => settleMarked(Exit.fail(e))),
          ),
        ),
        Effect.asVoid,
      )
      publishing = { queue, ended, fiber: fork(publishAll) }
      return publishing
    }

    const flush = () => {
      if (timer !== undefined) {
        clearTimeout(timer)
        timer = undefined
      }
      if (pendingBytes === 0) return
      const data = pending.length === 1 ? (pending[0] as Uint8Array) : Buffer.concat(pending)
      start().queue.unsafeOffer({
        _tag: "chunk",
        offset: flushed,
        data: pieces.seal(flushed, data),
        outputBytes,
      })
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
      else timer ??= setTimeout(flush, flushMs)
    }

    const totals = () => ({ output_bytes: outputBytes, stored_bytes: accepted })

    // Answered at once when nothing was published: every chunk (none) is stored.
    let finished: Effect.Effect<OutputTotals, NatsError> | undefined
    const finish = Effect.suspend(() => {
      if (finished !== undefined) return finished
      finishing = true
      flush()
      const done = totals()
      if (publishing !== undefined) {
        publishing.queue.unsafeOffer({ _tag: "done", totals: done })
        finished = Deferred.await(publishing.ended)
      } else {
        // Nothing written, nothing to mark; bytes written past what is kept still get a marker
        // with their count.
        if (done.output_bytes === 0) settleMarked(Exit.void)
        else fork(publishMarker(done))
        finished = Effect.succeed(done)
      }
      return finished
    })

    const markedDone = Effect.suspend(() => {
      if (markedExit !== undefined) return markedExit
      marked ??= Deferred.unsafeMake<void, NatsError>(FiberId.none)
      return Deferred.await(marked)
    })

    const close = Effect.suspend(() => {
      if (timer !== undefined) clearTimeout(timer)
      // Once finishing, the publisher ends by itself with the marker.
      return publishing === undefined || finishing ? Effect.void : Fiber.interrupt(publishing.fiber)
    })

    return { write, finish, marked: markedDone, totals, close } satisfies OutputSink
  })

/** `open`, closed with the scope. */
export const make = (
  account: string,
  run: string,
  cmd: string,
  options: SinkOptions = {},
): Effect.Effect<OutputSink, KeyringError, Nats | Storage | SealStream | Scope.Scope> =>
  Effect.acquireRelease(open(account, run, cmd, options), (sink) => sink.close)

// ---------------------------------------------------------------------------------------------
// Reading: in core, so the gateway reads output without importing the host agent.

export { awaitOutputAfter, incompleteTail, readOutput, readOutputAt } from "../../core/CommandOutput.ts"
