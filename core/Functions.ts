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

/** Builds the store over the storage map's `functions` and `versions` buckets. */
export const make: Effect.Effect<FunctionsService, NatsError, Nats | Storage> = Effect.gen(function* () {
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

  const version: FunctionsService["version"] = (id, n) =>
    isFunctionId(id) && Number.isSafeInteger(n) && n >= 1
      ? Effect.map(
          versions.get(functionKeys.version(id, n)),
          Option.map((e) => e.value),
        )
      : Effect.succeed(Option.none())

  const create: FunctionsService["create"] = (account, v, name) =>
    Effect.gen(function* () {
      // The version first: a function record always has its latest version to show.
      yield* versions.create(functionKeys.version(v.function, 1), v)
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
    })

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

/** The store as a layer. */
export const layer: Layer.Layer<Functions, NatsError, Nats | Storage> = Layer.effect(Functions, make)
