/**
 * Request-reply over core NATS for answers that come back from somewhere other than the request's
 * own subscriber (an actor answering a question that travelled through its JetStream mailbox).
 */
import { Duration, Effect } from "effect"
import { attemptSync, Nats, type NatsError } from "./Nats.ts"
import { ReplyTimeout, type Requests } from "./Requests.ts"

export { ReplyTimeout }

/**
 * Takes a fresh reply address (listening at once: the connection's shared inbox subscription already
 * exists on the server, so nothing needs flushing), runs `send(inbox)` (which must deliver the
 * question with the inbox as its reply address), and waits for the first reply; fails with
 * `ReplyTimeout` after `timeout`. No scope and no timer fiber: the shared inbox's sweep keeps the
 * deadline (an ask is on the path of every command).
 */
export const request = <E, R>(
  send: (inbox: string) => Effect.Effect<void, E, R>,
  timeout: Duration.DurationInput,
): Effect.Effect<Uint8Array, E | ReplyTimeout | NatsError, Nats | R> =>
  Effect.flatMap(Nats, ({ requests }) => requestVia(requests, send, timeout))

/** `request` on the given connection's requests (a service that holds its connection provides nothing per ask). */
export const requestVia = <E, R>(
  requests: Requests,
  send: (inbox: string) => Effect.Effect<void, E, R>,
  timeout: Duration.DurationInput,
): Effect.Effect<Uint8Array, E | ReplyTimeout | NatsError, R> =>
  Effect.suspend(() => {
    const inbox = requests.inbox("reply", Duration.toMillis(Duration.decode(timeout)))
    return send(inbox.subject).pipe(
      Effect.zipRight(inbox.reply),
      Effect.map((answer) => answer.data),
      Effect.onExit(() => Effect.sync(inbox.release)),
    )
  })

/** Sends `data` to a reply inbox (core NATS, fire-and-forget: a requester that gave up just misses it). */
export const reply = (inbox: string, data: Uint8Array | string): Effect.Effect<void, NatsError, Nats> =>
  // Synchronous: whatever the caller publishes next (an actor's ack) leaves in the same write.
  Effect.flatMap(Nats, ({ connection }) => attemptSync("reply", () => connection.publish(inbox, data)))
