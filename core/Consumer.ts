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
import { Effect, Option, Stream } from "effect"
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
  data: m.data,
  header: (name) => m.headers?.get(name) || undefined,
  ack: () => m.ack(),
  nak: (delayMs) => m.nak(delayMs),
  working: () => m.working(),
})

/** The deliveries of an existing consumer, in order, until the scope closes or the consumer goes away. */
export const consume = (
  stream: string,
  name: string,
): Effect.Effect<Stream.Stream<Delivery, NatsError>, NatsError, Nats | Scope.Scope> =>
  Effect.gen(function* () {
    const { js } = yield* Nats
    const consumer = yield* attempt(`consumer.get ${name}`, () => js.consumers.get(stream, name))
    const messages = yield* Effect.acquireRelease(
      attempt(`consume ${name}`, () =>
        consumer.consume({ max_messages: 64, abort_on_missing_resource: true }),
      ),
      // `stop`, not `close`: close waits for the iterator to be read to its end, which an
      // interrupted reader never does.
      (m) => Effect.sync(() => m.stop()),
    )
    // Not `Stream.fromAsyncIterable`: its release awaits the generator's `return()`, which waits for
    // the pending `next()`, which waits for a message that may never come. `stop` above ends it.
    const iterator = messages[Symbol.asyncIterator]()
    return Stream.repeatEffectOption(
      Effect.tryPromise({
        try: () => iterator.next(),
        catch: (cause) =>
          Option.some(
            new NatsError({
              operation: `consume ${name}`,
              message: cause instanceof Error ? cause.message : String(cause),
              cause,
            }),
          ),
      }).pipe(
        Effect.flatMap((r) => (r.done ? Effect.fail(Option.none()) : Effect.succeed(toDelivery(r.value)))),
      ),
    )
  })
