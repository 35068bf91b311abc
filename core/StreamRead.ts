/**
 * Reading stored messages of one subject of a JetStream stream, for readers that page through a
 * subject by sequence (command output). Single messages come from the stream's message-get API
 * (which, unlike direct get, needs no `allow_direct` on the stream); runs of messages come from an
 * ordered consumer started at a sequence, deleted as soon as the read ends (`dropConsumer`): the
 * server would keep an idle one for 5 minutes, and a burst of reads would fill its consumer limit.
 */
import { type Consumer, DeliverPolicy, type JsMsg, type MsgRequest, type StoredMsg } from "@nats-io/jetstream"
import type { MsgHdrs } from "@nats-io/transport-node"
import { Effect, Option, Stream } from "effect"
import { attempt, Nats, NatsError } from "./Nats.ts"

/** One stored message. */
export interface StoredMessage {
  readonly subject: string
  /** Stream sequence. */
  readonly seq: number
  readonly data: Uint8Array
  /** A header's first value. */
  readonly header: (name: string) => string | undefined
  /** From `readSubject`: how many messages on the subject came after this one when it was delivered. */
  readonly pending?: number
}

/**
 * Deletes an ordered consumer on the server once its reader is done, without waiting for the
 * answer (the reader's caller is not held up) and without failing (one the server already dropped,
 * or never made, is fine).
 */
export const dropConsumer = (consumer: Consumer): Effect.Effect<void> =>
  Effect.sync(() => {
    try {
      consumer.delete().catch(() => undefined)
    } catch {
      // never created on the server: nothing to delete
    }
  })

/** Which message to get: the last one on `subject`, or the first one on `subject` at or after `seq`. */
export type MessageQuery = { readonly lastOf: string } | { readonly nextOf: string; readonly seq: number }

const headerOf =
  (h: MsgHdrs | undefined) =>
  (name: string): string | undefined =>
    h?.get(name) || undefined

const fromStored = (m: StoredMsg): StoredMessage => ({
  subject: m.subject,
  seq: m.seq,
  data: m.data,
  header: headerOf(m.header),
})

const fromJs = (m: JsMsg): StoredMessage => ({
  subject: m.subject,
  seq: m.seq,
  data: m.data,
  header: headerOf(m.headers),
  pending: m.info.pending,
})

/** Gets one message by query; none when no message matches. */
export const getMessage = (
  stream: string,
  query: MessageQuery,
): Effect.Effect<Option.Option<StoredMessage>, NatsError, Nats> =>
  Effect.gen(function* () {
    const { jsm } = yield* Nats
    // The server's STREAM.MSG.GET takes `next_by_subj` with `seq`; the client's type lists only
    // `seq` and `last_by_subj` but passes the request through unchanged.
    const request =
      "lastOf" in query
        ? { last_by_subj: query.lastOf }
        : ({ seq: Math.max(1, query.seq), next_by_subj: query.nextOf } as unknown as MsgRequest)
    const found = yield* attempt(`stream.getMessage ${stream}`, () => jsm.streams.getMessage(stream, request))
    return found === null ? Option.none() : Option.some(fromStored(found))
  })

/**
 * The messages on `subject` from sequence `fromSeq` through `untilSeq` (inclusive), in order.
 * `untilSeq` must be a sequence of a message on `subject` (say from `{lastOf}`), so the stream
 * ends instead of waiting for messages to come.
 */
export const readSubject = (
  stream: string,
  subject: string,
  fromSeq: number,
  untilSeq: number,
): Stream.Stream<StoredMessage, NatsError, Nats> =>
  fromSeq > untilSeq
    ? Stream.empty
    : Stream.unwrapScoped(
        Effect.gen(function* () {
          const { js } = yield* Nats
          const consumer = yield* attempt(`consumer.ordered ${stream}`, () =>
            js.consumers.get(stream, {
              filter_subjects: subject,
              deliver_policy: DeliverPolicy.StartSequence,
              opt_start_seq: Math.max(1, fromSeq),
            }),
          )
          const messages = yield* Effect.acquireRelease(
            attempt(`consume ${stream}`, () => consumer.consume({ max_messages: 256 })),
            (m) =>
              Effect.promise(() =>
                m.close().then(
                  () => undefined,
                  () => undefined,
                ),
              ).pipe(Effect.zipRight(dropConsumer(consumer))),
          )
          return Stream.fromAsyncIterable(
            messages,
            (cause) =>
              new NatsError({
                operation: `consume ${stream}`,
                message: cause instanceof Error ? cause.message : String(cause),
                cause,
              }),
          ).pipe(
            Stream.takeUntil((m) => m.seq >= untilSeq || m.info.pending === 0),
            Stream.map(fromJs),
          )
        }),
      )
