/**
 * Partition leases and worker presence in KV `leases`.
 *
 * - `w.<worker>`: a worker's presence, `{owner, expiresAt}`, renewed every tick.
 * - `p.<type>.<partition>`: the lease of one mailbox partition, `{owner, expiresAt, consumer}`,
 *   claimed and renewed by compare-and-set on its revision, so two workers never both win it.
 *
 * `expiresAt` is the owner's clock plus the lease time; a lease past it may be claimed by anyone.
 * The owner treats it as lost a tenth of the lease earlier, so (with clocks roughly in step) it has
 * stopped before anyone else starts; the state compare-and-set catches the rest.
 */
import { Effect, Option, Schema } from "effect"
import * as Kv from "../Kv.ts"
import type { Nats, NatsError } from "../Nats.ts"

/** A lease or presence record. */
export const LeaseValue = Schema.Struct({
  owner: Schema.String,
  expiresAt: Schema.Number,
  /** The consumer the owner reads the partition with (deleted by the next owner). */
  consumer: Schema.optional(Schema.String),
})
export type LeaseValue = typeof LeaseValue.Type

/** KV key of a worker's presence: `w.<worker>`. */
export const presenceKey = (worker: string) => `w.${worker}`
/** KV key of a partition lease: `p.<type>.<partition>`. */
export const leaseKey = (type: string, partition: number) => `p.${type}.${partition}`

/** The typed view of the leases bucket. */
export const open = (bucket: string): Effect.Effect<Kv.Kv<LeaseValue>, NatsError, Nats> =>
  Kv.make(bucket, LeaseValue)

/** Ids of workers whose presence has not expired at `now`, sorted. */
export const liveWorkers = (kv: Kv.Kv<LeaseValue>, now: number) =>
  Effect.gen(function* () {
    const keys = yield* kv.keys("w.*")
    const entries = yield* Effect.forEach(keys, (k) => kv.get(k).pipe(Effect.option), { concurrency: 8 })
    return entries
      .flatMap((e) => (Option.isSome(e) && Option.isSome(e.value) ? [e.value.value.value] : []))
      .filter((v) => v.expiresAt > now)
      .map((v) => v.owner)
      .sort()
  })

/**
 * This worker's fair share of `partitions` among `workers` (sorted ids): an even split, the first
 * `partitions mod n` workers taking one more — 32 over 3 is 11/11/10.
 */
export const quotaOf = (workers: ReadonlyArray<string>, self: string, partitions: number): number => {
  const all = workers.includes(self) ? workers : [...workers, self].sort()
  const n = all.length
  const index = all.indexOf(self)
  return Math.floor(partitions / n) + (index < partitions % n ? 1 : 0)
}
