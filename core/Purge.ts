/**
 * Removing stored messages of one subject from a stream (cancelling a pending NATS message
 * schedule: the schedule is the message stored on its subject).
 */
import { Effect } from "effect"
import { attempt, Nats, type NatsError } from "./Nats.ts"

/** Purges every message stored on `subject` in `stream`; idempotent. */
export const purgeSubject = (stream: string, subject: string): Effect.Effect<void, NatsError, Nats> =>
  Effect.gen(function* () {
    const { jsm } = yield* Nats
    yield* attempt(`purge ${subject}`, () => jsm.streams.purge(stream, { filter: subject }))
  })
