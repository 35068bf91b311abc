/**
 * Carrying out a stored outbox: messages to mailboxes, timer schedules and cancellations, ask
 * replies. Every entry is idempotent — sends and schedules carry the message id recorded with the
 * state, so re-publishing the outbox of a redelivered message stores nothing twice (within the
 * MAILBOX duplicate window); a cancel purges a subject; a reply to a gone requester is lost.
 */
import { Effect } from "effect"
import * as Inbox from "../Inbox.ts"
import type { Nats, NatsError } from "../Nats.ts"
import { purgeSubject } from "../Purge.ts"
import * as JsStream from "../Stream.ts"
import type { OutboxEntry } from "./Record.ts"

/** Header on a fired timer message: the timer's name. */
export const TIMER_HEADER = "Hangar-Timer"
/** Header on a fired timer message: the id of the schedule that fired it. */
export const TIMER_ID_HEADER = "Hangar-Timer-Id"

const publishOne = (stream: string, entry: OutboxEntry): Effect.Effect<void, NatsError, Nats> => {
  switch (entry._tag) {
    case "Send":
      return Effect.asVoid(JsStream.publish(entry.subject, entry.body, { msgId: entry.msgId }))
    case "Schedule":
      return Effect.asVoid(
        JsStream.publish(entry.subject, entry.body, {
          msgId: entry.msgId,
          headers: { [TIMER_HEADER]: entry.timer, [TIMER_ID_HEADER]: entry.msgId },
          schedule: { at: new Date(entry.at), target: entry.target },
        }),
      )
    case "Cancel":
      return purgeSubject(stream, entry.subject)
    case "Reply":
      return Inbox.reply(entry.inbox, entry.body)
  }
}

/** Publishes every entry in order (two sends to one actor must arrive in the order the handler gave). */
export const publishAll = (
  stream: string,
  entries: ReadonlyArray<OutboxEntry>,
): Effect.Effect<void, NatsError, Nats> =>
  entries.length === 0
    ? Effect.void
    : Effect.forEach(entries, (e) => publishOne(stream, e), { discard: true })
