/**
 * Request-reply over core NATS for answers that come back from somewhere other than the request's
 * own subscriber (an actor answering a question that travelled through its JetStream mailbox).
 */
import { Data, Duration, Effect } from "effect"
import { attempt, Nats, type NatsError } from "./Nats.ts"

/** No reply arrived in time. */
export class ReplyTimeout extends Data.TaggedError("ReplyTimeout")<{ readonly timeoutMs: number }> {}

/**
 * Takes a fresh reply address (listening at once: the connection's shared inbox subscription already
 * exists on the server, so nothing needs flushing), runs `send(inbox)` (which must deliver the
 * question with the inbox as its reply address), and waits for the first reply; fails with
 * `ReplyTimeout` after `timeout`.
 */
export const request = <E, R>(
  send: (inbox: string) => Effect.Effect<void, E, R>,
  timeout: Duration.DurationInput,
): Effect.Effect<Uint8Array, E | ReplyTimeout | NatsError, Nats | R> =>
  Effect.gen(function* () {
    const { requests } = yield* Nats
    const inbox = yield* requests.inbox("reply")
    yield* send(inbox.subject)
    const ms = Duration.toMillis(Duration.decode(timeout))
    const answer = yield* inbox.reply.pipe(
      Effect.timeoutFail({ duration: timeout, onTimeout: () => new ReplyTimeout({ timeoutMs: ms }) }),
    )
    return answer.data
  }).pipe(Effect.scoped)

/** Sends `data` to a reply inbox (core NATS, fire-and-forget: a requester that gave up just misses it). */
export const reply = (inbox: string, data: Uint8Array | string): Effect.Effect<void, NatsError, Nats> =>
  Effect.gen(function* () {
    const { connection } = yield* Nats
    yield* attempt("reply", async () => connection.publish(inbox, data))
  })
