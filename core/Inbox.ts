/**
 * Request-reply over core NATS for answers that come back from somewhere other than the request's
 * own subscriber (an actor answering a question that travelled through its JetStream mailbox).
 */
import { createInbox } from "@nats-io/transport-node"
import { Data, Duration, Effect } from "effect"
import { attempt, Nats, type NatsError } from "./Nats.ts"

/** No reply arrived in time. */
export class ReplyTimeout extends Data.TaggedError("ReplyTimeout")<{ readonly timeoutMs: number }> {}

/**
 * Opens a fresh inbox, runs `send(inbox)` (which must deliver the question with the inbox as its
 * reply address), and waits for the first reply; fails with `ReplyTimeout` after `timeout`.
 */
export const request = <E, R>(
  send: (inbox: string) => Effect.Effect<void, E, R>,
  timeout: Duration.DurationInput,
): Effect.Effect<Uint8Array, E | ReplyTimeout | NatsError, Nats | R> =>
  Effect.gen(function* () {
    const { connection } = yield* Nats
    const inbox = createInbox()
    let resolve: (data: Uint8Array) => void = () => {}
    const answer = new Promise<Uint8Array>((r) => {
      resolve = r
    })
    yield* Effect.acquireRelease(
      Effect.sync(() => connection.subscribe(inbox, { max: 1, callback: (_err, msg) => resolve(msg.data) })),
      (sub) => Effect.sync(() => sub.unsubscribe()),
    )
    // The subscription must reach the server before the question can be answered.
    yield* attempt("flush", () => connection.flush())
    yield* send(inbox)
    const ms = Duration.toMillis(Duration.decode(timeout))
    return yield* Effect.promise(() => answer).pipe(
      Effect.timeoutFail({ duration: timeout, onTimeout: () => new ReplyTimeout({ timeoutMs: ms }) }),
    )
  }).pipe(Effect.scoped)

/** Sends `data` to a reply inbox (core NATS, fire-and-forget: a requester that gave up just misses it). */
export const reply = (inbox: string, data: Uint8Array | string): Effect.Effect<void, NatsError, Nats> =>
  Effect.gen(function* () {
    const { connection } = yield* Nats
    yield* attempt("reply", async () => connection.publish(inbox, data))
  })
