/**
 * Publishing to JetStream streams with duplicate detection: every message carries a
 * `Nats-Msg-Id`, so a retried publish within the stream's duplicate window is stored once and
 * acknowledged as a duplicate of the first.
 */
import { headers as natsHeaders } from "@nats-io/transport-node"
import { Duration, Effect } from "effect"
import { attempt, Nats, type NatsError } from "./Nats.ts"

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

/** Publishes `data` to `subject` and waits for the stream's acknowledgement (idempotent by `msgId`). */
export const publish = (
  subject: string,
  data: Uint8Array | string,
  options: PublishOptions,
): Effect.Effect<PublishAck, NatsError, Nats> =>
  Effect.gen(function* () {
    const { js } = yield* Nats
    const h = natsHeaders()
    for (const [k, v] of Object.entries(options.headers ?? {})) h.set(k, v)
    const ack = yield* attempt(`publish ${subject}`, () =>
      js.publish(subject, data, {
        msgID: options.msgId,
        headers: h,
        ...(options.ttl === undefined ? {} : { ttl: ttlOf(options.ttl) }),
        ...(options.schedule === undefined
          ? {}
          : { schedule: { specification: options.schedule.at, target: options.schedule.target } }),
      }),
    )
    return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate }
  })
