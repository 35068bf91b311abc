/**
 * Sending to actors: `send` publishes a message to the actor's mailbox subject
 * `mb.<type>.<partition>.<id>` with a caller-chosen `Nats-Msg-Id`, so a retried send is stored
 * once; `ask` sends a message carrying a reply inbox and waits for the handler's `reply`.
 *
 * Bodies are the message's JSON encoding (with its `_tag`), so `nats sub 'mb.>'` shows what
 * happens in plain text.
 */
import { randomUUID } from "node:crypto"
import { Context, type Duration, Effect, Either, Layer, Schema } from "effect"
import type { AnyActor, MessageOf, ReplyOf } from "../../schema/actors/Actor.ts"
import * as Inbox from "../Inbox.ts"
import type { Nats, NatsError } from "../Nats.ts"
import { Nats as NatsTag } from "../Nats.ts"
import { Storage } from "../Storage.ts"
import * as JsStream from "../Stream.ts"
import { AskFailed, AskTimeout, MessageInvalid } from "./Errors.ts"
import { codecsOf } from "./internal/Codecs.ts"
import { partitionOf } from "./Partition.ts"
import { ActorSettings } from "./Settings.ts"

/** Header of an asked message: the core NATS inbox the reply goes to. */
export const REPLY_HEADER = "Hangar-Reply"

/** The JSON body of a reply. */
export const ReplyBody = Schema.Union(
  Schema.TaggedStruct("Ok", { value: Schema.Unknown }),
  Schema.TaggedStruct("Failed", { tag: Schema.String, message: Schema.String }),
)

export interface MailboxService {
  /** The mailbox subject of an actor. */
  readonly subjectOf: (actor: AnyActor, id: string) => string
  /**
   * Stores `message` in the actor's mailbox; sending again with the same `msgId` within the stream's
   * duplicate window (10 minutes) stores nothing new. Messages of one sender arrive in send order.
   */
  readonly send: <A extends AnyActor>(
    actor: A,
    id: string,
    message: MessageOf<A>,
    options: { readonly msgId: string },
  ) => Effect.Effect<void, MessageInvalid | NatsError>
  /**
   * Sends `message` and waits for the handler's reply; `AskTimeout` after `timeout` (the message
   * stays queued and may still be handled), `AskFailed` when the handler failed terminally.
   */
  readonly ask: <A extends AnyActor>(
    actor: A,
    id: string,
    message: MessageOf<A>,
    options: { readonly timeout: Duration.DurationInput; readonly msgId?: string },
  ) => Effect.Effect<ReplyOf<A>, MessageInvalid | AskTimeout | AskFailed | NatsError>
}

const decodeReplyBody = Schema.decodeUnknownEither(Schema.parseJson(ReplyBody))
const textDecoder = new TextDecoder()

/** Sending to actors. */
export class Mailbox extends Context.Tag("hangar/actors/Mailbox")<Mailbox, MailboxService>() {}

/** Encodes a message of `actor` as its JSON body. */
export const encodeMessage = (actor: AnyActor, message: unknown): Either.Either<string, MessageInvalid> =>
  Either.mapLeft(
    codecsOf(actor).encodeMessage(message),
    (e) => new MessageInvalid({ actor: actor.name, message: e.message }),
  )

export const make = Effect.gen(function* () {
  const nats = yield* NatsTag
  const { names } = yield* Storage
  const settings = yield* ActorSettings.Tag

  const subjectOf: MailboxService["subjectOf"] = (actor, id) =>
    names.subjects.mailbox(actor.name, partitionOf(id, settings.partitions), id)

  const publish = (
    actor: AnyActor,
    id: string,
    message: unknown,
    msgId: string,
    headers?: Record<string, string>,
  ) =>
    Effect.flatMap(encodeMessage(actor, message), (body) =>
      Effect.asVoid(
        JsStream.publishWith(nats, subjectOf(actor, id), body, { msgId, ...(headers ? { headers } : {}) }),
      ),
    )

  const send: MailboxService["send"] = (actor, id, message, options) =>
    publish(actor, id, message, options.msgId)

  // The connection is held, not provided per ask (providing it cost about 25 fiber steps an ask).
  const ask: MailboxService["ask"] = (actor, id, message, options) =>
    Effect.gen(function* () {
      const msgId = options.msgId ?? `ask:${randomUUID()}`
      const data = yield* Inbox.requestVia(
        nats.requests,
        (inbox) => publish(actor, id, message, msgId, { [REPLY_HEADER]: inbox }),
        options.timeout,
      ).pipe(
        Effect.catchTag("ReplyTimeout", (e) =>
          Effect.fail(new AskTimeout({ actor: actor.name, id, timeoutMs: e.timeoutMs })),
        ),
      )
      const body = yield* Effect.orDie(decodeReplyBody(textDecoder.decode(data)))
      if (body._tag === "Failed") {
        return yield* Effect.fail(
          new AskFailed({ actor: actor.name, id, tag: body.tag, message: body.message }),
        )
      }
      return (yield* Effect.orDie(codecsOf(actor).decodeReply(body.value))) as ReplyOf<typeof actor>
    })

  return { subjectOf, send, ask } satisfies MailboxService
})

/** The mailbox client; needs the connection, the storage names and the actor settings. */
export const layer: Layer.Layer<Mailbox, never, Nats | Storage | typeof ActorSettings.Tag.Identifier> =
  Layer.effect(Mailbox, make)

/** Shorthand for `Mailbox.send`. */
export const send = <A extends AnyActor>(
  actor: A,
  id: string,
  message: MessageOf<A>,
  options: { readonly msgId: string },
) => Effect.flatMap(Mailbox, (m) => m.send(actor, id, message, options))

/** Shorthand for `Mailbox.ask`. */
export const ask = <A extends AnyActor>(
  actor: A,
  id: string,
  message: MessageOf<A>,
  options: { readonly timeout: Duration.DurationInput; readonly msgId?: string },
) => Effect.flatMap(Mailbox, (m) => m.ask(actor, id, message, options))
