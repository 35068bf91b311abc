/**
 * Creates every KV bucket, stream and object store of the storage map (`schema/Subjects.ts`) with
 * its retention, and provides their names to the rest of the process.
 *
 * `ensure` is idempotent and safe to run concurrently from several processes on every start: a
 * stream that does not exist is added; adding one that exists with the same config is a no-op on
 * the server; one that exists with another config (say a changed retention) is updated to ours.
 * The KV and object store streams are configured here as `@nats-io/kv` and `@nats-io/obj` would
 * configure them, so those clients bind to them unchanged.
 */
import type { StreamConfig } from "@nats-io/jetstream"
import { DiscardPolicy, RetentionPolicy, StorageType } from "@nats-io/jetstream"
import { Context, Effect, Layer, Schedule } from "effect"
import {
  type KvSpec,
  kvBuckets,
  type ObjectStoreSpec,
  objectStores,
  type StorageNames,
  type StreamSpec,
  storageNames,
  streams,
} from "../schema/Subjects.ts"
import { defineSettings, env } from "./Config.ts"
import { republishedPrefix } from "./Kv.ts"
import { attempt, Nats, type NatsError } from "./Nats.ts"

/** Storage settings: a name prefix (tests; "" in production) and the replica count (3 in a cluster). */
export const StorageSettings = defineSettings(
  "hangar/StorageSettings",
  { prefix: "", replicas: 1 } as { readonly prefix: string; readonly replicas: number },
  (d) => ({
    prefix: env.string("STORAGE_PREFIX", d.prefix),
    replicas: env.integer("NATS_REPLICAS", d.replicas),
  }),
)

/** The storage of this process, created and ready. */
export class Storage extends Context.Tag("hangar/Storage")<Storage, { readonly names: StorageNames }>() {}

const nanos = (ms: number) => ms * 1_000_000

type Config = Partial<StreamConfig> & { name: string }

/** The stream behind a KV bucket, as `@nats-io/kv` creates it. */
export const kvStreamConfig = (spec: KvSpec, replicas = 1): Config => ({
  name: `KV_${spec.name}`,
  subjects: [`$KV.${spec.name}.>`],
  retention: RetentionPolicy.Limits,
  max_msgs_per_subject: spec.history,
  max_age: nanos(spec.maxAgeMs),
  max_bytes: -1,
  max_msg_size: -1,
  storage: StorageType.File,
  discard: DiscardPolicy.New,
  allow_rollup_hdrs: true,
  // Any replica answers a direct get, one behind with the value before an acknowledged write:
  // replicated buckets are read from the stream's leader (`Kv.get`).
  allow_direct: replicas === 1,
  deny_delete: true,
  num_replicas: replicas,
  // Each stored write again, where `Kv.awaitValue` listens.
  republish: { src: `$KV.${spec.name}.>`, dest: `${republishedPrefix(spec.name)}>` },
})

/** The stream behind an object store, as `@nats-io/obj` creates it. */
export const objectStreamConfig = (spec: ObjectStoreSpec, replicas = 1): Config => ({
  name: `OBJ_${spec.name}`,
  subjects: [`$O.${spec.name}.C.>`, `$O.${spec.name}.M.>`],
  retention: RetentionPolicy.Limits,
  max_age: nanos(spec.maxAgeMs),
  storage: StorageType.File,
  discard: DiscardPolicy.New,
  allow_rollup_hdrs: true,
  allow_direct: replicas === 1,
  num_replicas: replicas,
})

/** A stream of the storage map. */
export const streamConfig = (spec: StreamSpec, replicas = 1): Config => ({
  name: spec.name,
  subjects: [...spec.subjects],
  retention: spec.retention === "workqueue" ? RetentionPolicy.Workqueue : RetentionPolicy.Limits,
  max_age: nanos(spec.maxAgeMs),
  duplicate_window: nanos(spec.duplicateWindowMs),
  storage: StorageType.File,
  discard: DiscardPolicy.Old,
  num_replicas: replicas,
  ...(spec.allowSchedules ? { allow_msg_schedules: true } : {}),
  ...(spec.allowMsgTtl ? { allow_msg_ttl: true } : {}),
  ...(spec.appendOnly ? { deny_delete: true, deny_purge: true } : {}),
})

// 10058: "stream name already in use with a different configuration".
const isDifferentConfig = (e: NatsError) => (e.cause as { code?: unknown } | undefined)?.code === 10058

const ensureStream = (config: Config) =>
  Effect.gen(function* () {
    const { jsm } = yield* Nats
    yield* attempt(`stream.add ${config.name}`, () => jsm.streams.add(config)).pipe(
      Effect.catchIf(isDifferentConfig, () =>
        attempt(`stream.update ${config.name}`, () => jsm.streams.update(config.name, config)),
      ),
    )
  })

/** Every stream config of the storage map (KV, object store and plain streams). */
export const allStreamConfigs = (names: StorageNames, replicas = 1): ReadonlyArray<Config> => [
  ...kvBuckets.map((b) => kvStreamConfig(names.kv[b], replicas)),
  ...objectStores.map((o) => objectStreamConfig(names.objects[o], replicas)),
  ...streams.map((s) => streamConfig(names.streams[s], replicas)),
]

/** Creates or updates every bucket, stream and object store of `names`; idempotent. */
export const ensure = (names: StorageNames, options: { readonly replicas?: number } = {}) =>
  Effect.forEach(allStreamConfigs(names, options.replicas ?? 1), ensureStream, {
    concurrency: 4,
    discard: true,
  }).pipe(Effect.withSpan("Storage.ensure"))

// What JetStream answers while it cannot place the storage yet: no answer at all (a cluster
// without a quorum of its nodes elects no meta leader; a server still starting), "JetStream
// temporarily unavailable" (10008), or too few live nodes for the replicas asked (10005 "no suitable
// peers for placement", 10023 "insufficient resources").
const notYetCodes: ReadonlySet<number> = new Set([10005, 10008, 10023])

/** Whether `e` means the server (or cluster) cannot place storage yet, rather than refusing it. */
export const isNotYetPlaceable = (e: NatsError): boolean => {
  const cause = e.cause as { name?: unknown; code?: unknown; cause?: unknown } | undefined
  const name = String(cause?.name ?? "")
  if (name === "TimeoutError" || name === "NoRespondersError") return true
  const inner = (cause?.cause as { name?: unknown } | undefined)?.name
  if (inner === "TimeoutError" || inner === "NoRespondersError") return true
  return typeof cause?.code === "number" && notYetCodes.has(cause.code)
}

/** How often `ensureWhenPlaceable` tries again, and how often it says it still waits. */
const RETRY_MS = 1_000
const SAY_EVERY_MS = 15_000

/**
 * `ensure`, waiting (forever, saying so in the log every 15 s) while JetStream cannot place it: a
 * role started against a cluster with fewer nodes up than it needs waits for them instead of
 * crashing. Any other failure (a refused config, an authorization error) fails at once.
 */
export const ensureWhenPlaceable = (names: StorageNames, options: { readonly replicas?: number } = {}) =>
  Effect.gen(function* () {
    const replicas = options.replicas ?? 1
    let saidAt = 0
    yield* ensure(names, options).pipe(
      Effect.tapError((e) =>
        isNotYetPlaceable(e) && Date.now() - saidAt >= SAY_EVERY_MS
          ? Effect.sync(() => {
              saidAt = Date.now()
            }).pipe(
              Effect.zipRight(
                Effect.logWarning(
                  replicas > 1
                    ? `NATS JetStream cannot place the storage yet: with ${replicas} replicas a cluster needs a quorum (${Math.floor(replicas / 2) + 1} of ${replicas} nodes) up to answer and ${replicas} up to create a stream; waiting`
                    : "NATS JetStream does not answer yet (is JetStream enabled on the server?); waiting",
                ).pipe(Effect.annotateLogs({ operation: e.operation, error: e.message, replicas })),
              ),
            )
          : Effect.void,
      ),
      Effect.retry({ while: isNotYetPlaceable, schedule: Schedule.spaced(`${RETRY_MS} millis`) }),
    )
  })

/** Ensures the storage named by `StorageSettings` (waiting while it cannot be placed) and provides its names. */
export const layer: Layer.Layer<
  Storage,
  NatsError,
  Nats | Context.Tag.Identifier<typeof StorageSettings.Tag>
> = Layer.effect(
  Storage,
  Effect.gen(function* () {
    const settings = yield* StorageSettings.Tag
    const names = storageNames(settings.prefix)
    yield* ensureWhenPlaceable(names, { replicas: settings.replicas })
    return { names }
  }),
)

/** The storage under `prefix` (tests: a unique prefix per test). */
export const layerPrefix = (prefix: string): Layer.Layer<Storage, NatsError, Nats> =>
  layer.pipe(Layer.provide(StorageSettings.layer({ prefix })))
