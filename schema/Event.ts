/**
 * Webhook events (spec "Events", DESIGN.md for `command.finished`). Every attempt of one event
 * carries the same `id` as `webhook-id`.
 */
import { Schema } from "effect"
import { CommandRecord } from "./Command.ts"
import { Timestamp } from "./Common.ts"
import { EventId, RunId } from "./Ids.ts"
import { Run } from "./Run.ts"

/** `run.succeeded` or `run.failed`, with the run as `GET /v1/runs/{id}` returns it. */
export const RunEvent = Schema.Struct({
  id: EventId,
  type: Schema.Literal("run.succeeded", "run.failed"),
  created: Timestamp,
  data: Run,
}).annotations({ identifier: "RunEvent" })
export type RunEvent = typeof RunEvent.Type

/** `command.finished`: a command the caller sent has ended (never sent for the agent's commands). */
export const CommandFinishedEvent = Schema.Struct({
  id: EventId,
  type: Schema.Literal("command.finished"),
  created: Timestamp,
  data: Schema.Struct({ run: RunId, command: CommandRecord }),
}).annotations({ identifier: "CommandFinishedEvent" })
export type CommandFinishedEvent = typeof CommandFinishedEvent.Type

/** Any webhook event body. */
export const WebhookEvent = Schema.Union(RunEvent, CommandFinishedEvent).annotations({
  identifier: "WebhookEvent",
})
export type WebhookEvent = typeof WebhookEvent.Type
