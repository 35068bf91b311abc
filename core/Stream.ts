/**
 * Publishing to JetStream streams with duplicate detection: every message carries a
 * `Nats-Msg-Id`, so a retried publish within the stream's duplicate window is stored once and
 * acknowledged as a duplicate of the first.
 */
import { PubHeaders } from "@nats-io/jetstream"
import { type Msg, type MsgHdrs, headers as natsHeaders } from "@nats-io/transport-node"
import { Duration, Effect } from "effect"
import { attempt, Nats, type NatsClients, NatsError } from "./Nats.ts"
import type { Requests } from "./Requests.ts"

/** How to publish one message. */
export interface PublishOptions {
  /** Deduplication id (`Nats-Msg-Id`); derive it deterministically so a retry reuses it. */
  readonly msgId: string
  /** Per-message TTL (the stream must allow it; whole seconds, at least 1). */
  readonly ttl?: Duration.DurationInput
  /** Extra headers. */
  readonly headers?: Readonly<Record<string, string>>
  /**
   * Makes the message a schedule (the stream must allow schedules): it sits on `subject` and at
   * `at` the server publishes its payload to `target`. A newer schedule on the same subject
   * replaces the older one.
   */
  readonly schedule?: { readonly at: Date; readonly target: string }
}

/** The server's acknowledgement. */
export interface PublishAck {
  readonly stream: string
  /** Sequence of the stored message (of the first copy when `duplicate`). */
  readonly seq: number
  /** True when a message with the same `msgId` was already stored within the duplicate window. */
  readonly duplicate: boolean
}

const ttlOf = (ttl: Duration.DurationInput): string =>
  `${Math.max(1, Math.ceil(Duration.toMillis(Duration.decode(ttl)) / 1000))}s`

/** How long a publish waits for the stream's acknowledgement (the client's default). */
const PUBLISH_TIMEOUT_MS = 5_000

const textDecoder = new TextDecoder()

/**
 * The stream's answer to a publish: its acknowledgement, or its refusal as a `NatsError` whose
 * `cause` carries the JetStream error code (`{ code: 10071 }` is a wrong last sequence).
 */
export const ackOf = (operation: string, reply: Msg): Effect.Effect<PublishAck, NatsError> => {
  let body: {
    stream?: string
    seq?: number
    duplicate?: boolean
    error?: { code?: number; err_code?: number; description?: string }
  }
  try {
    body = JSON.parse(textDecoder.decode(reply.data))
  } catch (cause) {
    return Effect.fail(new NatsError({ operation, message: "unreadable acknowledgement", cause }))
  }
  if (body.error !== undefined) {
    const { code, err_code, description } = body.error
    return Effect.fail(
      new NatsError({
        operation,
        message: description ?? "refused",
        cause: { code: err_code, status: code },
      }),
    )
  }
  if (typeof body.stream !== "string" || typeof body.seq !== "number")
    return Effect.fail(new NatsError({ operation, message: "invalid acknowledgement" }))
  return Effect.succeed({ stream: body.stream, seq: body.seq, duplicate: body.duplicate === true })
}

/**
 * Publishes with the given headers through the connection's shared inbox and waits for the stream's
 * acknowledgement. For the `core/` wrappers (a KV write is a publish with an expected revision).
 */
export const publishVia = (
  requests: Requests,
  operation: string,
  subject: string,
  data: Uint8Array | string,
  headers: MsgHdrs,
): Effect.Effect<PublishAck, NatsError> =>
  Effect.flatMap(requests.request(operation, subject, data, headers, PUBLISH_TIMEOUT_MS), (reply) =>
    ackOf(operation, reply),
  )

/**
 * As `publishVia`, in two steps (`Requests.send`): running it publishes, and the effect it gives
 * waits for the acknowledgement, so several publishes can leave in one write before any is awaited.
 */
export const sendVia = (
  requests: Requests,
  operation: string,
  subject: string,
  data: Uint8Array | string,
  headers: MsgHdrs,
): Effect.Effect<Effect.Effect<PublishAck, NatsError>, NatsError> =>
  Effect.map(requests.send(operation, subject, data, headers, PUBLISH_TIMEOUT_MS), (reply) =>
    Effect.flatMap(reply, (msg) => ackOf(operation, msg)),
  )

/** Publishes `data` to `subject` and waits for the stream's acknowledgement (idempotent by `msgId`). */
export const publish = (
  subject: string,
  data: Uint8Array | string,
  options: PublishOptions,
): Effect.Effect<PublishAck, NatsError, Nats> =>
  Effect.flatMap(Nats, (clients) => publishWith(clients, subject, data, options))

/** `publish` on the given connection (for services that hold theirs). */
export const publishWith = (
  clients: NatsClients,
  subject: string,
  data: Uint8Array | string,
  options: PublishOptions,
): Effect.Effect<PublishAck, NatsError> => {
  const h = natsHeaders()
  h.set(PubHeaders.MsgIdHdr, options.msgId)
  if (options.headers !== undefined) for (const k in options.headers) h.set(k, options.headers[k]!)
  if (options.ttl !== undefined) h.set(PubHeaders.MessageTTL, ttlOf(options.ttl))
  if (options.schedule === undefined)
    return publishVia(clients.requests, `publish ${subject}`, subject, data, h)
  // Schedules are rare (timers); the client writes their headers.
  const schedule = options.schedule
  return attempt(`publish ${subject}`, () =>
    clients.js.publish(subject, data, {
      headers: h,
      schedule: { specification: schedule.at, target: schedule.target },
    }),
  ).pipe(Effect.map((ack) => ({ stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate })))
}
