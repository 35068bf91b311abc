/**
 * The function store: functions in KV `functions` and their versions in KV `versions`. The
 * gateway publishes them; the run worker will read the version a run starts from, so it lives in
 * `core/`.
 *
 * Key scheme:
 *
 * | bucket      | key              | value                                           |
 * |-------------|------------------|-------------------------------------------------|
 * | `functions` | `<acc>.<fnc>`    | `StoredFunction`: the `Function` and its account |
 * | `versions`  | `<fnc>.<n>`      | `Version` (written once with `create`, never changed) |
 *
 * Function ids are unique across accounts, so a version key needs no account; reads go through
 * the function record, which does.
 *
 * A version is never changed once written (`create` refuses a second write of its key) and never
 * deleted, so each process keeps the versions it read or wrote (the newest, up to
 * `VERSIONS_KEPT_BYTES`): a run's start reads its version in the gateway and again in the host
 * agent, each a round trip on the way to the run's first result. A version not found is not kept
 * (it may be published next).
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import { ApiError } from "../schema/Errors.ts"
import { FunctionRecord, Version } from "../schema/Function.ts"
import { AccountId, FunctionId } from "../schema/Ids.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"
import { appendVersion, valuesOf } from "./Versioned.ts"

/** A function as stored: the spec's record plus its account. */
export const StoredFunction = Schema.Struct({ account: AccountId, function: FunctionRecord })
export type StoredFunction = typeof StoredFunction.Type

type StoreError = NatsError | Kv.KvValueInvalid
type Fx<A> = Effect.Effect<A, StoreError | ApiError>

/** KV keys of the store. */
export const functionKeys = {
  // <acc>.<fnc>  (bucket `functions`)
  function: (account: string, id: string) => `${account}.${id}`,
  // <acc>.*  (bucket `functions`)
  functionsOf: (account: string) => `${account}.*`,
  // <fnc>.<n>  (bucket `versions`)
  version: (id: string, n: number) => `${id}.${n}`,
  // <fnc>.*  (bucket `versions`)
  versionsOf: (id: string) => `${id}.*`,
} as const

/** A function with its latest version (an item of `GET /v1/functions` before `last` is added). */
export interface FunctionWithLatest {
  readonly function: FunctionRecord
  readonly definition: Version
}

/** What the store offers. */
export interface FunctionsService {
  /** Stores a new function with `version` as its version 1 (`version.version` must be 1). */
  readonly create: (account: AccountId, version: Version, name: string) => Fx<Version>
  /** Stores the next version of the account's function `id`, numbered by the store (`make(n)`). */
  readonly publish: (account: AccountId, id: FunctionId, make: (n: number) => Version) => Fx<Version>
  /** The account's function, or none. */
  readonly get: (account: string, id: string) => Effect.Effect<Option.Option<FunctionRecord>, StoreError>
  /** One version of a function, or none (the caller has checked the function's account). */
  readonly version: (id: string, n: number) => Effect.Effect<Option.Option<Version>, StoreError>
  /** Every version of a function, oldest first. */
  readonly versions: (id: string) => Effect.Effect<ReadonlyArray<Version>, StoreError>
  /** The account's functions with their latest versions, most recently updated first. */
  readonly list: (account: string) => Effect.Effect<ReadonlyArray<FunctionWithLatest>, StoreError>
}

/** The function store. */
export class Functions extends Context.Tag("hangar/Functions")<Functions, FunctionsService>() {}

const isFunctionId = Schema.is(FunctionId)

/**
 * How much of the versions one process keeps in memory, counted as their JSON's length (the
 * oldest kept goes first): a usual version takes a few KiB, the largest the limits allow a few MiB.
 */
export const VERSIONS_KEPT_BYTES = 16 * 2 ** 20

/**
 * Builds the store over the storage map's `functions` and `versions` buckets, keeping versions in
 * memory up to `keptBytes` of their JSON.
 */
export const makeKeeping = (keptBytes: number): Effect.Effect<FunctionsService, NatsError, Nats | Storage> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const functions = yield* Kv.make(names.kv.functions.name, StoredFunction)
    const versions = yield* Kv.make(names.kv.versions.name, Version)

    const get: FunctionsService["get"] = (account, id) =>
      isFunctionId(id)
        ? Effect.map(
            functions.get(functionKeys.function(account, id)),
            Option.flatMap((e) =>
              e.value.account === account ? Option.some(e.value.function) : Option.none(),
            ),
          )
        : Effect.succeed(Option.none())

    // Versions read or written by this process, by key, oldest first (a version never changes),
    // with the length of each one's JSON.
    const kept = new Map<string, { readonly version: Version; readonly bytes: number }>()
    let keptTotal = 0
    const keep = (key: string, version: Version) => {
      const bytes = JSON.stringify(version).length
      if (kept.has(key) || bytes > keptBytes) return
      for (const [oldest, { bytes: b }] of kept) {
        if (keptTotal + bytes <= keptBytes) break
        kept.delete(oldest)
        keptTotal -= b
      }
      kept.set(key, { version, bytes })
      keptTotal += bytes
    }
    const version: FunctionsService["version"] = (id, n) => {
      if (!isFunctionId(id) || !Number.isSafeInteger(n) || n < 1) return Effect.succeed(Option.none())
      const key = functionKeys.version(id, n)
      const known = kept.get(key)
      if (known !== undefined) return Effect.succeed(Option.some(known.version))
      return Effect.map(
        versions.get(key),
        Option.map((e) => {
          keep(key, e.value)
          return e.value
        }),
      )
    }

    const create: FunctionsService["create"] = (account, v, name) =>
      Effect.gen(function* () {
        // The version first: a function record always has its latest version to show.
        const key = functionKeys.version(v.function, 1)
        yield* versions.create(key, v)
        keep(key, v)
        yield* functions.create(functionKeys.function(account, v.function), {
          account,
          function: { id: v.function, name, latest: 1, updated_at: v.created_at, updated_by: v.created_by },
        })
        return v
      }).pipe(Effect.catchTag("StateConflict", () => Effect.fail(ApiError.conflict())))

    const publish: FunctionsService["publish"] = (account, id, makeVersion) =>
      appendVersion({
        what: "function",
        heads: functions,
        headKey: functionKeys.function(account, id),
        latestOf: (h) => h.function.latest,
        versions,
        versionKey: (n) => functionKeys.version(id, n),
        make: makeVersion,
        advance: (h, n, v) => ({
          ...h,
          function: { ...h.function, latest: n, updated_at: v.created_at, updated_by: v.created_by },
        }),
      }).pipe(Effect.tap((v) => keep(functionKeys.version(id, v.version), v)))

    const versionsOf: FunctionsService["versions"] = (id) =>
      isFunctionId(id)
        ? Effect.map(valuesOf(versions, functionKeys.versionsOf(id)), (vs) =>
            [...vs].sort((a, b) => a.version - b.version),
          )
        : Effect.succeed([])

    const list: FunctionsService["list"] = (account) =>
      Effect.gen(function* () {
        const records = yield* valuesOf(functions, functionKeys.functionsOf(account))
        const items = yield* Effect.forEach(
          records.filter((r) => r.account === account),
          (r) =>
            Effect.map(version(r.function.id, r.function.latest), (v) =>
              Option.map(v, (definition) => ({ function: r.function, definition })),
            ),
          { concurrency: 16 },
        )
        return items
          .flatMap((o) => (Option.isSome(o) ? [o.value] : []))
          .sort((a, b) => b.function.updated_at.localeCompare(a.function.updated_at))
      })

    return { create, publish, get, version, versions: versionsOf, list } satisfies FunctionsService
  })

/** Builds the store over the storage map's `functions` and `versions` buckets. */
export const make: Effect.Effect<FunctionsService, NatsError, Nats | Storage> =
  makeKeeping(VERSIONS_KEPT_BYTES)

/** The store as a layer. */
export const layer: Layer.Layer<Functions, NatsError, Nats | Storage> = Layer.effect(Functions, make)
