/**
 * The host commands of `hangar admin`: `hosts` lists every registered host with its room, its
 * machines, its heartbeat's age and whether it is drained; `drain` / `undrain` take a host out of
 * placement and back (the scheduler's own state, asked of the scheduler actor, so the answer says
 * what placement now does). Each answers one JSON-ready object.
 */
import { Data, Effect, Layer, Option, Schema } from "effect"
import * as AccountClient from "../core/actors/AccountClient.ts"
import * as Mailbox from "../core/actors/Mailbox.ts"
import * as Connected from "../core/Connected.ts"
import * as Kv from "../core/Kv.ts"
import { Storage } from "../core/Storage.ts"
import { DrainAnswer, Scheduler, schedulerId } from "../schema/actors/Scheduler.ts"
import { HostRecord, isLive } from "../schema/Host.ts"

/** A host the command names is not registered (no record in KV `hosts`). */
export class HostNotFound extends Data.TaggedError("HostNotFound")<{ readonly message: string }> {}

// NATS, the storage map and a mailbox, from HANGAR_* variables.
const layer = AccountClient.mailboxLayer.pipe(Layer.provideMerge(Connected.layerFromEnv))

const askScheduler = (message: Schema.Schema.Type<typeof Scheduler.message>) =>
  Mailbox.ask(Scheduler, schedulerId, message, { timeout: "20 seconds" }).pipe(
    Effect.flatMap(Schema.decodeUnknown(DrainAnswer)),
  )

const hostsKv = Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.hosts.name, HostRecord))

const recordOf = (host: string) =>
  Effect.flatMap(hostsKv, (kv) => kv.get(host)).pipe(
    Effect.map(Option.map((e) => e.value)),
    Effect.catchTag("KvValueInvalid", () => Effect.succeed(Option.none<HostRecord>())),
  )

/** `hangar admin drain --host ID`: the host takes no new runs; answers `{host, draining, runs}`. */
export const drain = (host: string) =>
  Effect.gen(function* () {
    if (Option.isNone(yield* recordOf(host)))
      return yield* new HostNotFound({ message: `host not found: ${host} (no record in KV hosts)` })
    const answer = yield* askScheduler({ _tag: "Drain", host })
    return answer.hosts[0]!
  }).pipe(Effect.provide(layer))

/** `hangar admin undrain --host ID`: the host takes runs again (idempotent, known host or not). */
export const undrain = (host: string) =>
  Effect.map(askScheduler({ _tag: "Undrain", host }), (a) => a.hosts[0]!).pipe(Effect.provide(layer))

/**
 * `hangar admin hosts`: every registered host (its record may be stale: `live` says), oldest id
 * first, with its budget, what is used and free, its machines, its heartbeat's age and the
 * scheduler's view (drained, the runs it holds there); and drained hosts with no record.
 */
export const hosts = Effect.gen(function* () {
  const kv = yield* hostsKv
  const records = yield* Effect.forEach(yield* kv.keys(), recordOf, { concurrency: 8 })
  const views = new Map((yield* askScheduler({ _tag: "Hosts" })).hosts.map((v) => [v.host, v]))
  const now = Date.now()
  const listed = records.flatMap((r) => (Option.isSome(r) ? [r.value] : []))
  const out = listed.map((h) => ({
    id: h.id,
    driver: h.driver,
    live: isLive(h, now),
    heartbeat_age_ms: now - Date.parse(h.heartbeat_at),
    draining: views.get(h.id)?.draining ?? false,
    vcpus: h.vcpus,
    used_vcpus: h.vcpus - h.free_vcpus,
    free_vcpus: h.free_vcpus,
    memory_mib: h.memory_mib,
    used_memory_mib: h.memory_mib - h.free_memory_mib,
    free_memory_mib: h.free_memory_mib,
    machines: h.machines.length,
    runs: views.get(h.id)?.runs ?? [],
  }))
  const unregistered = [...views.values()]
    .filter((v) => !listed.some((h) => h.id === v.host))
    .map((v) => ({ id: v.host, registered: false, draining: v.draining, runs: v.runs }))
  return { hosts: [...out.sort((a, b) => (a.id < b.id ? -1 : 1)), ...unregistered] }
}).pipe(Effect.provide(layer))
