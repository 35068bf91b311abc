/**
 * Settings of the actor runtime (`HANGAR_ACTOR_*`). Every worker and sender of one deployment must
 * use the same partition count: it decides the mailbox subject of an actor.
 */
import { defineSettings, env } from "../Config.ts"

export interface ActorSettingsShape {
  /** Mailbox partitions per actor type (default 32). */
  readonly partitions: number
  /** How long a partition lease lasts without renewal (default 10 s); a dead worker's partitions move after this. */
  readonly leaseMs: number
  /** How often a worker renews its leases and rebalances (default a third of the lease). */
  readonly renewMs: number
  /** How long the server waits for an ack before redelivering (default 30 s). */
  readonly ackWaitMs: number
  /** Unacknowledged messages per partition (different actors run side by side; one actor's in order). */
  readonly maxInFlight: number
  /** At most this many of one actor's waiting messages are applied as one group with one state write (1 = a write per message). */
  readonly groupMax: number
  /** First retry delay of a retryable handler failure; doubled per attempt up to `retryMaxMs` (keep it below `ackWaitMs`). */
  readonly retryBaseMs: number
  readonly retryMaxMs: number
  /** This worker's id in leases; empty = a fresh `wrk_…` id per start. */
  readonly workerId: string
}

/** The actor runtime's settings. */
export const ActorSettings = defineSettings(
  "hangar/ActorSettings",
  {
    partitions: 32,
    leaseMs: 10_000,
    renewMs: 3_333,
    ackWaitMs: 30_000,
    maxInFlight: 256,
    groupMax: 64,
    retryBaseMs: 200,
    retryMaxMs: 10_000,
    workerId: "",
  } as ActorSettingsShape,
  (d) => ({
    partitions: env.integer("ACTOR_PARTITIONS", d.partitions),
    leaseMs: env.integer("ACTOR_LEASE_MS", d.leaseMs),
    renewMs: env.integer("ACTOR_RENEW_MS", d.renewMs),
    ackWaitMs: env.integer("ACTOR_ACK_WAIT_MS", d.ackWaitMs),
    maxInFlight: env.integer("ACTOR_MAX_IN_FLIGHT", d.maxInFlight),
    groupMax: env.integer("ACTOR_GROUP_MAX", d.groupMax),
    retryBaseMs: env.integer("ACTOR_RETRY_BASE_MS", d.retryBaseMs),
    retryMaxMs: env.integer("ACTOR_RETRY_MAX_MS", d.retryMaxMs),
    workerId: env.string("ACTOR_WORKER_ID", d.workerId),
  }),
)
