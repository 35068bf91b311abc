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

/**
 * Publishes every entry. Those for one subject go one after another, in the order the handler gave
 * (two sends to one actor must arrive in that order; a timer cancelled and scheduled again must
 * be purged first), each after the last is stored, so a failure never lets a later one in ahead of
 * it; different subjects go side by side (an actor's end cancels four timers and tells three
 * others: eight round trips one after another were most of its handling). Replies go last, so an
 * asker hears back only once every effect is stored. A failure leaves the whole outbox to be
 * published again (every entry is idempotent).
 */
export const publishAll = (
  stream: string,
  entries: ReadonlyArray<OutboxEntry>,
): Effect.Effect<void, NatsError, Nats> => {
  const bySubject = new Map<string, Array<OutboxEntry>>()
  const replies: Array<OutboxEntry> = []
  for (const e of entries) {
    if (e._tag === "Reply") replies.push(e)
    else {
      const list = bySubject.get(e.subject)
      if (list === undefined) bySubject.set(e.subject, [e])
      else list.push(e)
    }
  }
  const inOrder = (list: ReadonlyArray<OutboxEntry>) =>
    Effect.forEach(list, (e) => publishOne(stream, e), { discard: true })
  const groups = [...bySubject.values()]
  // One subject (the usual outbox: a send and its reply) needs no fiber of its own.
  const effects =
    groups.length <= 1
      ? inOrder(groups[0] ?? [])
      : Effect.forEach(groups, inOrder, { concurrency: "unbounded", discard: true })
  return replies.length === 0 ? effects : Effect.zipRight(effects, inOrder(replies))
}
