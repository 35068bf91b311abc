/**
 * The webhook actor's contract (type `webhook`, id = the event id): one actor per event, which
 * posts the event to the run's webhook address with Standard Webhooks headers signed (Ed25519,
 * `v1a`) by the account's key, at once, after 1 minute and after 10 minutes (`WebhookSettings`),
 * until a 2xx answers within 10 seconds. The handler lives in `actors/webhooks/Webhook.ts` (actors role only).
 *
 *   Deliver  (run actor, host agent)  the event to post (idempotent by event id)
 *   Attempt  (own timer)              the next attempt
 */
import { Effect, Schema } from "effect"
import { Count, Timestamp } from "../Common.ts"
import { AccountId, EventId, RunId } from "../Ids.ts"
import * as ActorDef from "./Actor.ts"

/**
 * An event to deliver. `body` is the event's JSON as it will be posted, except that a run event's
 * `data.output.url` is filled in (signed afresh) at each attempt from the stored run.
 */
export const Deliver = Schema.TaggedStruct("Deliver", {
  event: EventId,
  account: AccountId,
  run: RunId,
  url: Schema.String,
  /** `run.succeeded`, `run.failed` or `command.finished`. */
  type: Schema.Literal("run.succeeded", "run.failed", "command.finished"),
  /** The event body (`{id, type, created, data}`) as JSON text. */
  body: Schema.String,
})
export type Deliver = typeof Deliver.Type
export const Attempt = Schema.TaggedStruct("Attempt", {})

export const WebhookMessage = Schema.Union(Deliver, Attempt)
export type WebhookMessage = typeof WebhookMessage.Type

/** One attempt's outcome. */
export const AttemptRecord = Schema.Struct({
  at: Timestamp,
  /** The HTTP status, when one came back. */
  status: Schema.optional(Schema.Int),
  /** Why it did not count (refused address, timeout, connection error, non-2xx). */
  error: Schema.optional(Schema.String),
})

export const WebhookState = Schema.Struct({
  delivery: Schema.optional(Deliver),
  attempts: Schema.Array(AttemptRecord),
  /** `pending` until a 2xx (`delivered`) or the last attempt failed (`gave_up`). */
  state: Schema.Literal("pending", "delivered", "gave_up"),
  /** Attempts made. */
  made: Count,
})
export type WebhookState = typeof WebhookState.Type

export const initialState: WebhookState = { attempts: [], state: "pending", made: 0 }

/** The webhook actor as senders see it. */
export const Webhook = ActorDef.make({
  name: "webhook",
  state: WebhookState,
  initial: initialState,
  message: WebhookMessage,
  handler: () => Effect.dieMessage("the webhook actor's handler runs in the actors role (Webhook.ts)"),
})
