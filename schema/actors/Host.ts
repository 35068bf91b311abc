/**
 * The host actor's contract (type `host`, id = the host id). Unlike the other actors it is not run
 * by the actor workers: each host agent consumes its own mailbox subject `mb.host.<p>.<host id>`
 * with one durable consumer (`host-agent/runs/HostActor.ts`), in order, because only that process
 * owns the host's machines and capacity. Senders use `Mailbox.send(Host, hostId, …)` or a handler's
 * `Actor.to(Host, hostId, …)` like for any actor.
 *
 *   Place          (scheduler)  reserve room for the run's size and start its machine, or refuse:
 *                               → run `Started`, scheduler `Placed`; or scheduler `Refused`
 *   Stop           (run actor)  the run ended: cancel its commands, destroy the machine, free the room
 *                               → scheduler `Freed`
 *   CancelCommand  (run actor)  cancel one command of a run on this host (kills its processes)
 *
 * A host agent that restarts has lost its machines: a `Stop` or `CancelCommand` for a run it does
 * not know changes nothing; runs it held fail `infrastructure` when its record goes stale.
 */
import { Effect, Schema } from "effect"
import { IntAtLeast } from "../Common.ts"
import { Size } from "../Definition.ts"
import { AccountId, CommandId, RunId } from "../Ids.ts"
import * as ActorDef from "./Actor.ts"

/** Start the run's machine; the host reads the run (KV `runs`) and its version for the rest. */
export const Place = Schema.TaggedStruct("Place", {
  run: RunId,
  account: AccountId,
  size: Size,
  vcpus: IntAtLeast(1),
  memory_mib: IntAtLeast(1),
})
export type Place = typeof Place.Type
export const Stop = Schema.TaggedStruct("Stop", { run: RunId })
export const CancelCommand = Schema.TaggedStruct("CancelCommand", {
  run: RunId,
  command: CommandId,
  sequence: IntAtLeast(1),
})

/**
 * A line for the run's log from outside the machine (the agent loop: the model's messages), kept
 * by the run's log on this host as `{at, kind, ...fields}`; dropped when the run is not here.
 */
export const Log = Schema.TaggedStruct("Log", {
  run: RunId,
  kind: Schema.Literal("assistant", "compaction", "notice"),
  fields: Schema.Record({ key: Schema.String, value: Schema.Unknown }),
})
export type Log = typeof Log.Type

export const HostMessage = Schema.Union(Place, Stop, CancelCommand, Log)
export type HostMessage = typeof HostMessage.Type

/** The host actor as senders see it (no state kept by the runtime: the host agent holds it). */
export const Host = ActorDef.make({
  name: "host",
  state: Schema.Struct({}),
  initial: {},
  message: HostMessage,
  handler: () => Effect.dieMessage("the host actor runs in its host agent (host-agent/runs/HostActor.ts)"),
})
