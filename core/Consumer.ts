/**
 * Durable pull consumers on a JetStream stream, as scoped Effect streams of deliveries.
 *
 * Written for the actor runtime: one consumer per owned mailbox partition, recreated (under a new
 * name) whenever ownership changes hands, so the unacknowledged message of the previous owner is
 * redelivered at once instead of after `ack_wait`, and a paused previous owner pulling from its old
 * consumer gets nothing.
 */
import { AckPolicy, DeliverPolicy, type JsMsg } from "@nats-io/jetstream"
import type { Scope } from "effect"
import { Chunk, Effect, Option, Stream } from "effect"
import { attempt, Nats, NatsError } from "./Nats.ts"

/** How a partition consumer is configured. */
export interface ConsumerOptions {
  /** Only messages on this subject (wildcards allowed). */
  readonly filter: string
  /** How long the server waits for an ack before redelivering. */
  readonly ackWaitMs: number
  /** Unacknowledged messages at once; 1 hands out messages strictly one after the other. */
  readonly maxAckPending: number
}

/** One message handed to this consumer; `ack`/`nak`/`working` are fire-and-forget. */
export interface Delivery {
  readonly subject: string
  /** Stream sequence: unique in the stream and the same on every redelivery. */
  readonly seq: number
  /** 1 on first delivery, then counting redeliveries. */
  readonly deliveries: number
  /** When the stream stored the message (epoch ms, the server's clock): the same on every redelivery. */
  readonly storedAt: number
  readonly data: Uint8Array
  readonly header: (name: string) => string | undefined
  readonly ack: () => void
  /** Asks for redelivery after `delayMs`. */
  readonly nak: (delayMs: number) => void
  /** Resets the ack timer (a long handler). */
  readonly working: () => void
}

const codeOf = (e: NatsError): unknown =>
  (e.cause as { api_error?: { err_code?: unknown }; code?: unknown })?.code
const notFound = (e: NatsError) => codeOf(e) === 10014 || /consumer not found/i.test(e.message)

/** Deletes a consumer; a missing one is fine. */
export const remove = (stream: string, name: string): Effect.Effect<void, NatsError, Nats> =>
  Effect.gen(function* () {
    const { jsm } = yield* Nats
    yield* attempt(`consumer.delete ${name}`, () => jsm.consumers.delete(stream, name)).pipe(
      Effect.catchIf(notFound, () => Effect.void),
    )
  })

/**
 * Creates durable consumer `name` on `stream` delivering every stored message matching `filter`,
 * first deleting any other consumer with the same filter (a work-queue stream allows only one).
 */
export const create = (
  stream: string,
  name: string,
  options: ConsumerOptions,
): Effect.Effect<void, NatsError, Nats> =>
  Effect.gen(function* () {
    const { jsm } = yield* Nats
    const add = attempt(`consumer.add ${name}`, () =>
      jsm.consumers.add(stream, {
        durable_name: name,
        filter_subject: options.filter,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: options.ackWaitMs * 1_000_000,
        max_ack_pending: options.maxAckPending,
        max_deliver: -1,
      }),
    )
    yield* add.pipe(
      Effect.catchAll((error) =>
        Effect.gen(function* () {
          // Another consumer (of an earlier owner whose name we do not know) holds the filter.
          const others = yield* attempt("consumer.list", async () => {
            const out: Array<string> = []
            for await (const c of jsm.consumers.list(stream)) {
              if (c.config.filter_subject === options.filter && c.name !== name) out.push(c.name)
            }
            return out
          })
          if (others.length === 0) return yield* Effect.fail(error)
          yield* Effect.forEach(others, (other) => remove(stream, other), { discard: true })
          yield* add
        }),
      ),
    )
  })

const toDelivery = (m: JsMsg): Delivery => ({
  subject: m.subject,
  seq: m.seq,
  deliveries: m.info.deliveryCount,
  storedAt: m.time.getTime(),
  data: m.data,
  header: (name) => m.headers?.get(name) || undefined,
  ack: () => m.ack(),
  nak: (delayMs) => m.nak(delayMs),
  working: () => m.working(),
})

/**
 * Takes the deliveries of an existing consumer in order, a batch at a time: whatever arrived since
 * the last take (at least one; it waits for the first). Fails with `None` once the consumer's
 * scope closed, with the error when the consumer went away (it was deleted by a new owner).
 *
 * Messages arrive through the client's callback into a plain array, so a backlog costs one wake-up
 * per batch instead of a promise and a fiber step per message.
 */
export const batches = (
  stream: string,
  name: string,
): Effect.Effect<
  Effect.Effect<ReadonlyArray<Delivery>, Option.Option<NatsError>>,
  NatsError,
  Nats | Scope.Scope
> =>
  Effect.gen(function* () {
    const { js } = yield* Nats
    const consumer = yield* attempt(`consumer.get ${name}`, () => js.consumers.get(stream, name))
    let buffer: Array<Delivery> = []
    let ended: Option.Option<NatsError> | undefined
    let waiter:
      | ((result: Effect.Effect<ReadonlyArray<Delivery>, Option.Option<NatsError>>) => void)
      | undefined
    const wake = () => {
      const resume = waiter
      if (resume === undefined) return
      waiter = undefined
      if (buffer.length > 0) {
        const out = buffer
        buffer = []
        resume(Effect.succeed(out))
      } else if (ended !== undefined) resume(Effect.fail(ended))
    }
    const messages = yield* Effect.acquireRelease(
      attempt(`consume ${name}`, () =>
        consumer.consume({
          max_messages: 128,
          abort_on_missing_resource: true,
          callback: (m) => {
            buffer.push(toDelivery(m))
            wake()
          },
        }),
      ),
      // `stop`, not `close`: close waits for pending messages to be handed out, which nobody does now.
      (m) =>
        Effect.sync(() => {
          ended = Option.none()
          m.stop()
        }),
    )
    void messages.closed().then((result) => {
      ended ??=
        result instanceof Error
          ? Option.some(
              new NatsError({ operation: `consume ${name}`, message: result.message, cause: result }),
            )
          : Option.none()
      wake()
    })
    return Effect.async<ReadonlyArray<Delivery>, Option.Option<NatsError>>((resume) => {
      if (buffer.length > 0) {
        const out = buffer
        buffer = []
        return resume(Effect.succeed(out))
      }
      if (ended !== undefined) return resume(Effect.fail(ended))
      waiter = resume
      return Effect.sync(() => {
        if (waiter === resume) waiter = undefined
      })
    })
  })

/** The deliveries of an existing consumer, in order, until the scope closes or the consumer goes away. */
export const consume = (
  stream: string,
  name: string,
): Effect.Effect<Stream.Stream<Delivery, NatsError>, NatsError, Nats | Scope.Scope> =>
  Effect.map(batches(stream, name), (take) =>
    Stream.repeatEffectChunkOption(Effect.map(take, Chunk.unsafeFromArray)),
  )
