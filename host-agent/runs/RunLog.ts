/**
 * A run's log (spec "Log"): JSON lines `{at, kind, …}` kept in memory as they come and written as
 * parts to the `logs` object store, `<run>.<n>` with `n` from 1, each sealed for the run's account.
 * A part is written every `logFlushMs` while lines wait, and once more when the run's machine ends
 * (`end`, after its `end` line); after each part the run actor hears `LogPart{n}` (message id
 * `<run>:log:<n>`; `last` for the machine's end), which is how `GET /v1/runs/{id}/log` knows how
 * many parts there are, and that the log is whole.
 *
 * Kinds written by the host agent: `machine` (created; `started_over` when an earlier life of the
 * host agent died before the run's first machine was ready), `adopted` (a later life of the host
 * agent took the machine over), `input` (unpacked and checked, or the
 * problem), `setup` (one per setup command: the command, its output and exit status), `ready`,
 * `tool_call` (a command the agent sent: `name`, `arguments`, and its `result` or `error`),
 * `finish` (a `finish` command and what came of it) and `end` (why the machine went away).
 *
 * A part that cannot be stored keeps its lines for the next attempt; the number only advances once
 * a part is stored, so parts never leave a gap.
 */
import type { Scope } from "effect"
import { Clock, Effect, Stream } from "effect"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import type { Nats } from "../../core/Nats.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import { SealStream } from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import { Run } from "../../schema/actors/Run.ts"
import { timestamp } from "../../schema/Common.ts"
import type { AccountId, RunId } from "../../schema/Ids.ts"
import { kvKeys } from "../../schema/Subjects.ts"

/** One run's log. */
export interface RunLog {
  /** Adds a line `{at, kind, ...fields}` (at = now). */
  readonly append: (kind: string, fields?: Readonly<Record<string, unknown>>) => Effect.Effect<void>
  /** Writes the waiting lines as the next part, if any wait; a failure is logged and the lines kept. */
  readonly flush: Effect.Effect<void>
  /** As `flush`, for the last part, written as the machine ends: the run actor hears the log is whole. */
  readonly end: Effect.Effect<void>
  /** Parts stored so far. */
  readonly parts: Effect.Effect<number>
}

/** The log of `run`, with a flusher every `flushMs` for the life of the scope. */
export const make = (options: {
  readonly run: RunId
  readonly account: AccountId
  readonly flushMs: number
  /** Parts an earlier life of the host agent stored (an adopted machine's log goes on after them). */
  readonly stored?: number
}): Effect.Effect<RunLog, never, Scope.Scope | Nats | Storage | SealStream | Mailbox.Mailbox> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const seal = yield* SealStream
    const services = yield* Effect.context<Nats | Mailbox.Mailbox>()
    const lock = yield* Effect.makeSemaphore(1)
    let lines: Array<string> = []
    let stored = options.stored ?? 0

    const append: RunLog["append"] = (kind, fields = {}) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        lines.push(`${JSON.stringify({ at: timestamp(now), kind, ...fields })}\n`)
      })

    const write = (last: boolean) =>
      Effect.gen(function* () {
        // A count, not the array: lines appended while the part is stored stay for the next one.
        const taken = lines.length
        if (taken === 0) {
          // The last lines went with a part the timer wrote meanwhile: that one is the last.
          if (last && stored > 0)
            yield* Mailbox.send(
              Run,
              options.run,
              { _tag: "LogPart", n: stored, last },
              { msgId: `${options.run}:log:${stored}:last` },
            )
          return
        }
        const n = stored + 1
        const name = kvKeys.logPart(options.run, n)
        const logs = yield* ObjectStore.make(names.objects.logs.name)
        const data = Buffer.from(lines.slice(0, taken).join(""))
        yield* logs.put(name, Stream.make(data).pipe(seal.seal(options.account, name)))
        yield* Mailbox.send(
          Run,
          options.run,
          { _tag: "LogPart", n, ...(last ? { last } : {}) },
          { msgId: `${options.run}:log:${n}` },
        )
        stored = n
        lines = lines.slice(taken)
      })

    const written = (last: boolean) =>
      write(last).pipe(
        Effect.catchAll((e) =>
          Effect.logWarning("run log part not stored; its lines wait for the next").pipe(
            Effect.annotateLogs({ run: options.run, error: e._tag, message: e.message }),
          ),
        ),
        Effect.provide(services),
        lock.withPermits(1),
        Effect.uninterruptible,
      )
    const flush = written(false)

    // Interruptible even when started from an uninterruptible region (the host actor's handler).
    yield* Effect.sleep(options.flushMs).pipe(
      Effect.zipRight(flush),
      Effect.forever,
      Effect.interruptible,
      Effect.forkScoped,
    )

    return { append, flush, end: written(true), parts: Effect.sync(() => stored) } satisfies RunLog
  })
