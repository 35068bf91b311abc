/**
 * What operators watch on `evt.<account>.<run>` (stream `EVENTS`, 30 days; `hangar admin watch`,
 * `nats sub 'evt.>'`): a run's state changes and its commands' ends. A stable interface: fields are
 * only ever added, and `v` names the shape. No tenant data: ids, states, kinds and failure kinds,
 * never prompts, arguments, output or details.
 *
 * Each event is stored once (its `Nats-Msg-Id` is `run:<run>:<state>` or `cmd:<run>:<sequence>`),
 * so a writer that retries publishes it again harmlessly; it is published when its writer has
 * made the change, so a watcher may see it a moment before the record reads back changed.
 */
import { Schema } from "effect"
import { CommandKind, CommandSource, CommandState } from "./Command.ts"
import { Timestamp } from "./Common.ts"
import { RunFailure, RunState } from "./Run.ts"

/** `run.state`: the run entered `state` (queued at its creation, then running, then its end). */
export const RunStateEvent = Schema.Struct({
  type: Schema.Literal("run.state"),
  v: Schema.Literal(1),
  at: Timestamp,
  account: Schema.String,
  run: Schema.String,
  state: RunState,
  failure: Schema.optional(RunFailure),
}).annotations({ identifier: "RunStateEvent" })
export type RunStateEvent = typeof RunStateEvent.Type

/** `command.ended`: a command of the run reached an end state. */
export const CommandEndedEvent = Schema.Struct({
  type: Schema.Literal("command.ended"),
  v: Schema.Literal(1),
  at: Timestamp,
  account: Schema.String,
  run: Schema.String,
  command: Schema.String,
  sequence: Schema.Number,
  kind: CommandKind,
  source: CommandSource,
  state: CommandState,
}).annotations({ identifier: "CommandEndedEvent" })
export type CommandEndedEvent = typeof CommandEndedEvent.Type

/** Any operator event. */
export const OperatorEvent = Schema.Union(RunStateEvent, CommandEndedEvent).annotations({
  identifier: "OperatorEvent",
})
export type OperatorEvent = typeof OperatorEvent.Type

/** The message id that stores `event` once. */
export const eventMsgId = (event: OperatorEvent): string =>
  event.type === "run.state" ? `run:${event.run}:${event.state}` : `cmd:${event.run}:${event.sequence}`
