/**
 * The commands of one machine (spec, command rule 2): started in arrival order — sequence order,
 * whatever order they are submitted in, so a gap waits for its command (or a `skip`) — and run
 * concurrently once started. Cancelling a queued command ends it at once; cancelling a running one
 * interrupts it (the guest kills its processes) and waits until it is over. Closing the
 * dispatcher's scope (the machine going away) cancels whatever still runs.
 */
import type { Scope } from "effect"
import { Cause, Data, Deferred, Effect, Exit, Fiber } from "effect"
import type { Nats } from "../../core/Nats.ts"
import type { SealStream } from "../../core/SealStream.ts"
import type { Storage } from "../../core/Storage.ts"
import type { CommandRecord } from "../../schema/Command.ts"
import type { GuestSession } from "../guest/GuestSession.ts"
import { type CommandContext, execute, type HandledElsewhere, type Outcome } from "./Executor.ts"

/** A sequence was already taken by another command, or was passed over. */
export class SequenceUsed extends Data.TaggedError("SequenceUsed")<{
  readonly sequence: number
  readonly command: string
}> {}

/** A submitted command: when it started, and how it ended. */
export interface Ticket {
  readonly record: CommandRecord
  readonly started: Deferred.Deferred<void>
  readonly outcome: Deferred.Deferred<Outcome, HandledElsewhere>
}

/** One machine's dispatcher. */
export interface Dispatcher {
  /** Queues a command; submitting the same command id again returns its ticket. */
  readonly submit: (record: CommandRecord) => Effect.Effect<Ticket, SequenceUsed>
  /** Marks a sequence that will not come here (a command handled elsewhere), so later ones need not wait for it. */
  readonly skip: (sequence: number) => Effect.Effect<void>
  /**
   * As `skip`, and waits until the sequence's turn has come (every earlier command started): a
   * command handled elsewhere (`finish`) still starts in arrival order.
   */
  readonly turn: (sequence: number) => Effect.Effect<void>
  /** Cancels a queued or running command; false when unknown or already ended. */
  readonly cancel: (id: string) => Effect.Effect<boolean>
}

export interface DispatcherOptions {
  readonly guest: GuestSession
  readonly context: CommandContext
  /** The first sequence this machine will see (1 for a new run). */
  readonly firstSequence?: number
  /** Called as each command starts, in sequence order (say, to record it `running`). */
  readonly onStart?: (record: CommandRecord) => Effect.Effect<void>
}

interface Entry extends Ticket {
  fiber?: Fiber.RuntimeFiber<void>
  cancelled: boolean
}

const cancelled: Outcome = { state: "cancelled" }

/** A dispatcher for one machine; it lives as long as the scope. */
export const make = (
  options: DispatcherOptions,
): Effect.Effect<Dispatcher, never, Nats | Storage | SealStream | Scope.Scope> =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    const services = yield* Effect.context<Nats | Storage | SealStream>()
    const byId = new Map<string, Entry>()
    const waiting = new Map<number, Entry>()
    const skipped = new Set<number>()
    const turns = new Map<number, Deferred.Deferred<void>>()
    let next = options.firstSequence ?? 1

    const runEntry = (entry: Entry) =>
      execute(options.guest, entry.record, options.context).pipe(
        Effect.exit,
        Effect.flatMap((exit) =>
          Exit.isSuccess(exit)
            ? Deferred.succeed(entry.outcome, exit.value)
            : Cause.isFailType(exit.cause)
              ? Deferred.fail(entry.outcome, exit.cause.error)
              : Deferred.succeed(entry.outcome, {
                  state: "failed",
                  error: `internal error: ${Cause.pretty(exit.cause)}`,
                }),
        ),
        Effect.onInterrupt(() => Deferred.succeed(entry.outcome, cancelled)),
        Effect.asVoid,
        Effect.provide(services),
      )

    // Starts every command whose turn has come, in sequence order. One pass at a time, and not cut
    // midway (a command taken off the queue is always started). No lock: nothing in a pass waits, so
    // a fiber that finds one going (it can only have yielded its turn) asks it for another round
    // instead of waiting for it (a semaphore cost every command about 30 fiber steps).
    let passing = false
    let again = false
    const pass = Effect.gen(function* () {
      for (;;) {
        if (skipped.delete(next)) {
          const turn = turns.get(next)
          if (turn) {
            turns.delete(next)
            yield* Deferred.succeed(turn, undefined)
          }
          next++
          continue
        }
        const entry = waiting.get(next)
        if (!entry) return
        waiting.delete(next)
        next++
        if (entry.cancelled) continue
        yield* Deferred.succeed(entry.started, undefined)
        if (options.onStart) yield* options.onStart(entry.record)
        // Cancelled while this pass had yielded its turn: it ended as cancelled, and does not run.
        if (entry.cancelled) continue
        // Forked from an uninterruptible pass: made interruptible, or nothing could cancel it.
        entry.fiber = yield* Effect.forkIn(Effect.interruptible(runEntry(entry)), scope)
      }
    })
    const rounds: Effect.Effect<void> = Effect.suspend(() => {
      again = false
      return Effect.zipRight(
        pass,
        Effect.suspend(() => (again ? rounds : Effect.void)),
      )
    })
    const advance = Effect.suspend(() => {
      if (passing) {
        again = true
        return Effect.void
      }
      passing = true
      return Effect.uninterruptible(
        Effect.ensuring(
          rounds,
          Effect.sync(() => {
            passing = false
          }),
        ),
      )
    })

    const submit: Dispatcher["submit"] = (record) =>
      Effect.gen(function* () {
        const known = byId.get(record.id)
        if (known) return known
        if (record.sequence < next || waiting.has(record.sequence) || skipped.has(record.sequence))
          return yield* new SequenceUsed({ sequence: record.sequence, command: record.id })
        const entry: Entry = {
          record,
          started: yield* Deferred.make<void>(),
          outcome: yield* Deferred.make<Outcome, HandledElsewhere>(),
          cancelled: false,
        }
        byId.set(record.id, entry)
        waiting.set(record.sequence, entry)
        yield* advance
        return entry
      })

    const skip: Dispatcher["skip"] = (sequence) =>
      Effect.suspend(() => {
        if (sequence < next || waiting.has(sequence)) return Effect.void
        skipped.add(sequence)
        return advance
      })

    const turn: Dispatcher["turn"] = (sequence) =>
      Effect.gen(function* () {
        if (sequence < next || waiting.has(sequence)) return
        let reached = turns.get(sequence)
        if (!reached) {
          reached = yield* Deferred.make<void>()
          turns.set(sequence, reached)
        }
        skipped.add(sequence)
        yield* advance
        yield* Deferred.await(reached)
      })

    const cancel: Dispatcher["cancel"] = (id) =>
      Effect.gen(function* () {
        const entry = byId.get(id)
        if (!entry || (yield* Deferred.isDone(entry.outcome))) return false
        entry.cancelled = true
        if (entry.fiber) yield* Fiber.interrupt(entry.fiber)
        // A queued command ends here; a running one already ended as `cancelled` unless it had just finished.
        yield* Deferred.succeed(entry.outcome, cancelled)
        return (yield* Deferred.await(entry.outcome).pipe(Effect.either)).pipe((e) =>
          e._tag === "Right" ? e.right.state === "cancelled" : false,
        )
      })

    return { submit, skip, turn, cancel } satisfies Dispatcher
  })
