/**
 * Operator events (`schema/OperatorEvent.ts`) on `evt.<account>.<run>`: published into stream
 * `EVENTS` by the writers of run and command records, and followed live by `hangar admin watch`.
 */
import type { Scope } from "effect"
import { Cause, Chunk, type Duration, Effect, Either, Option, Schedule, Schema, Stream } from "effect"
import type { ParseError } from "effect/ParseResult"
import type { CommandRecord } from "../schema/Command.ts"
import { endedCommandStates } from "../schema/Command.ts"
import { eventMsgId, OperatorEvent } from "../schema/OperatorEvent.ts"
import { Nats, type NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"
import { publish as publishStream } from "./Stream.ts"
import * as StreamRead from "./StreamRead.ts"

// Synchronous codecs (an event is published on the path of every command's end).
const encode = Schema.encodeEither(Schema.parseJson(OperatorEvent))
const decode = Schema.decodeEither(Schema.parseJson(OperatorEvent))

/**
 * Stores `event` on its run's subject, once (its message id is derived from it, so a retried
 * write's event is deduplicated). Fails with `NatsError` when the store does not take it.
 */
export const publish = (event: OperatorEvent): Effect.Effect<void, NatsError | ParseError, Nats | Storage> =>
  Effect.flatMap(Storage, ({ names }) =>
    Either.match(encode(event), {
      onLeft: (e): Effect.Effect<void, NatsError | ParseError, Nats> => Effect.fail(e),
      onRight: (text) =>
        Effect.asVoid(
          publishStream(names.subjects.events(event.account, event.run), text, { msgId: eventMsgId(event) }),
        ),
    }),
  )

/** The `command.ended` event of `record` (of `account`'s run), or none while it has not ended. */
export const commandEnded = (
  account: string,
  record: CommandRecord,
  at?: string,
): OperatorEvent | undefined =>
  endedCommandStates.has(record.state) && account !== ""
    ? {
        type: "command.ended",
        v: 1,
        at: record.ended_at ?? (at || new Date().toISOString()),
        account,
        run: record.run,
        command: record.id,
        sequence: record.sequence,
        kind: record.kind,
        source: record.source,
        state: record.state,
      }
    : undefined

const defaultRetryFor = "2 minutes"
const retryEvery = Schedule.spaced("500 millis")
const defaultRetry = retryEvery.pipe(Schedule.upTo(defaultRetryFor))

/**
 * `publish` for writers whose record write already happened and must not fail for an event:
 * tried again every half second while NATS does not take it (a node gone, a stream electing its
 * leader), for up to `retryFor`; then logged and let go (the record stays the truth).
 */
export const publishAfterWrite = (
  event: OperatorEvent | undefined,
  retryFor: Duration.DurationInput = defaultRetryFor,
) =>
  event === undefined
    ? Effect.void
    : publish(event).pipe(
        Effect.retry({
          while: (e) => e._tag === "NatsError",
          schedule: retryFor === defaultRetryFor ? defaultRetry : retryEvery.pipe(Schedule.upTo(retryFor)),
        }),
        Effect.catchAllCause((cause) =>
          Effect.logWarning("operator event not published").pipe(
            Effect.annotateLogs({ type: event.type, run: event.run, error: Cause.pretty(cause) }),
          ),
        ),
      )

/**
 * The events published from now on, live (core subscription on the subjects: nothing stored is
 * replayed), for `account` and `run` or every one (`undefined`). A message that is not an
 * operator event is skipped.
 */
export const live = (filter: {
  readonly account?: string | undefined
  readonly run?: string | undefined
}): Stream.Stream<OperatorEvent, never, Nats | Storage | Scope.Scope> =>
  Stream.unwrapScoped(
    Effect.gen(function* () {
      const { connection } = yield* Nats
      const { names } = yield* Storage
      const subject = names.subjects.eventsWatch(filter.account, filter.run)
      const text = new TextDecoder()
      return Stream.asyncScoped<OperatorEvent>((emit) =>
        Effect.acquireRelease(
          Effect.sync(() =>
            connection.subscribe(subject, {
              callback: (_e, msg) => {
                const event = decode(text.decode(msg.data))
                if (Either.isRight(event)) void emit.single(event.right)
              },
            }),
          ),
          (sub) => Effect.sync(() => sub.unsubscribe()),
        ).pipe(Effect.zipRight(Effect.promise(() => connection.flush()))),
      )
    }),
  )

/** The events stored for `account`'s run `run` so far, in order (stream `EVENTS`, 30 days). */
export const stored = (
  account: string,
  run: string,
): Effect.Effect<ReadonlyArray<OperatorEvent>, NatsError, Nats | Storage> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const stream = names.streams.EVENTS.name
    const subject = names.subjects.events(account, run)
    const last = yield* StreamRead.getMessage(stream, { lastOf: subject })
    if (Option.isNone(last)) return []
    const text = new TextDecoder()
    const all = yield* Stream.runCollect(StreamRead.readSubject(stream, subject, 1, last.value.seq))
    return Chunk.toReadonlyArray(all).flatMap((m) => {
      const event = decode(text.decode(m.data))
      return Either.isRight(event) ? [event.right] : []
    })
  })
