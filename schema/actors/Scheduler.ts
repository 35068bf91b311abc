/**
 * The scheduler actor's contract (type `scheduler`, one instance, id `main`): the queue of runs
 * waiting for a machine, in creation order, and where each placed run went. The handler lives in
 * `actors/scheduler/Scheduler.ts` (actors role only).
 *
 *   Enqueue  (run actor)   a queued run waits (idempotent by run id)
 *   Dequeue  (run actor)   the run ended while queued or placed: forget it
 *   Placed   (host agent)  the host took the run (its record now holds the machine)
 *   Refused  (host agent)  the host had no room: the run goes back to its place in the queue
 *   Freed    (host agent)  a machine went away: room to place the next runs
 *   Tick     (own timer)   re-reads the live hosts every `tickMs` while anything waits or runs:
 *                          new hosts get work, runs on a host that stopped beating fail
 *   Drain    (operator)    ask: the host takes no new runs (its running ones go on); answers
 *                          `DrainAnswer` (idempotent)
 *   Undrain  (operator)    ask: the host takes runs again; answers `DrainAnswer` (idempotent)
 *   Hosts    (operator)    ask: answers `DrainAnswer` for every host draining or holding runs
 *
 * Placement: strictly first come, first served — the oldest waiting run is placed on the live host
 * with the most free vCPUs that fits its vCPUs and memory (free as the host's record says, less what
 * was offered to it and not yet answered); when it fits nowhere, younger runs wait behind it. A host
 * is the authority on its own room: it may refuse an offer, and the run is offered again later.
 */
import { Effect, Schema } from "effect"
import { IntAtLeast, Timestamp } from "../Common.ts"
import { Size } from "../Definition.ts"
import { AccountId, RunId } from "../Ids.ts"
import * as ActorDef from "./Actor.ts"

/** The one scheduler's id. */
export const schedulerId = "main"

/** A run waiting for a machine. */
export const Waiting = Schema.Struct({
  run: RunId,
  account: AccountId,
  size: Size,
  vcpus: IntAtLeast(1),
  memory_mib: IntAtLeast(1),
  created_at: Timestamp,
})
export type Waiting = typeof Waiting.Type

export const Enqueue = Schema.TaggedStruct("Enqueue", Waiting.fields)
export const Dequeue = Schema.TaggedStruct("Dequeue", { run: RunId })
export const Placed = Schema.TaggedStruct("Placed", { run: RunId, host: Schema.String })
export const Refused = Schema.TaggedStruct("Refused", { run: RunId, host: Schema.String })
export const Freed = Schema.TaggedStruct("Freed", { run: RunId, host: Schema.String })
export const Tick = Schema.TaggedStruct("Tick", {})
export const Drain = Schema.TaggedStruct("Drain", { host: Schema.String })
export const Undrain = Schema.TaggedStruct("Undrain", { host: Schema.String })
export const Hosts = Schema.TaggedStruct("Hosts", {})

export const SchedulerMessage = Schema.Union(
  Enqueue,
  Dequeue,
  Placed,
  Refused,
  Freed,
  Tick,
  Drain,
  Undrain,
  Hosts,
)
export type SchedulerMessage = typeof SchedulerMessage.Type

/** The scheduler's state. */
export const SchedulerState = Schema.Struct({
  /** Runs waiting, oldest first (by `created_at`, then run id). */
  queue: Schema.Array(Waiting),
  /** Runs offered to a host and not answered yet: run → {host, the waiting entry}. */
  offered: Schema.Record({
    key: Schema.String,
    value: Schema.Struct({ host: Schema.String, waiting: Waiting }),
  }),
  /** Runs a host took: run → host (to fail them when the host is gone). */
  placed: Schema.Record({ key: Schema.String, value: Schema.String }),
  /**
   * The room each placed run takes (run → vCPUs and memory), so a host record that does not list
   * the run yet still counts it. A state from before this field counts only the host's record.
   */
  room: Schema.optionalWith(
    Schema.Record({
      key: Schema.String,
      value: Schema.Struct({ vcpus: Schema.Number, memory_mib: Schema.Number }),
    }),
    { default: () => ({}) },
  ),
  /**
   * Hosts holding runs whose heartbeat was found stale, by when (the scheduler's clock) that was
   * first seen: they are declared gone only if they stay stale for a while after (see Scheduler.ts).
   */
  suspect: Schema.optionalWith(Schema.Record({ key: Schema.String, value: Schema.Number }), {
    default: () => ({}),
  }),
  /** Hosts an operator drained: offered nothing until undrained (sorted). */
  draining: Schema.optionalWith(Schema.Array(Schema.String), { default: () => [] }),
})
export type SchedulerState = typeof SchedulerState.Type

export const initialState: SchedulerState = {
  queue: [],
  offered: {},
  placed: {},
  room: {},
  suspect: {},
  draining: [],
}

/** One host as the scheduler sees it: drained or not, and the runs it holds (placed or offered). */
export const HostView = Schema.Struct({
  host: Schema.String,
  draining: Schema.Boolean,
  runs: Schema.Array(Schema.String),
})
export type HostView = typeof HostView.Type

/** The answer to `Drain` and `Undrain` (that host), and to `Hosts` (every host it knows of). */
export const DrainAnswer = Schema.Struct({ hosts: Schema.Array(HostView) })
export type DrainAnswer = typeof DrainAnswer.Type

/** The scheduler as senders see it; its handler runs in the actors role (`Scheduler.ts`). */
export const Scheduler = ActorDef.make({
  name: "scheduler",
  state: SchedulerState,
  initial: initialState,
  message: SchedulerMessage,
  handler: () => Effect.dieMessage("the scheduler's handler runs in the actors role (Scheduler.ts)"),
})
