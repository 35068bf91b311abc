/**
 * The provider store: providers and their versions in KV `providers`. The gateway publishes them;
 * the run worker will read the version a run uses (and open its key from `Secrets`), so it lives in
 * `core/`.
 *
 * Key scheme:
 *
 * | key                    | value                                                        |
 * |------------------------|--------------------------------------------------------------|
 * | `<acc>.<prv>`          | `ProviderHead`: name and newest version                      |
 * | `<acc>.<prv>.<n>`      | `ProviderVersion`: the `Provider` and the id of its sealed key |
 *
 * Versions are written once (`create`) and never change (see `Versioned.ts`). The key itself is in
 * `Secrets` (binding `vendor`); nothing here holds it.
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import { Timestamp } from "../schema/Common.ts"
import { ApiError } from "../schema/Errors.ts"
import {
  AccountId,
  noProvider,
  type ProviderId,
  ProviderId as ProviderIdSchema,
  type ProviderRef,
  parseProviderRef,
  providerRef,
  SecretId,
} from "../schema/Ids.ts"
import { Provider } from "../schema/Provider.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"
import { appendVersion, valuesOf } from "./Versioned.ts"

/** A provider's head record. */
export const ProviderHead = Schema.Struct({
  id: ProviderIdSchema,
  account: AccountId,
  name: Schema.String,
  latest: Schema.Number,
  created_at: Timestamp,
  updated_at: Timestamp,
})
export type ProviderHead = typeof ProviderHead.Type

/** A provider version as stored: what the API returns, plus where its key is sealed. */
export const ProviderVersion = Schema.Struct({ account: AccountId, provider: Provider, key_secret: SecretId })
export type ProviderVersion = typeof ProviderVersion.Type

/** A provider with its versions, newest first (an item of `GET /v1/providers`). */
export interface ProviderListing {
  readonly id: ProviderId
  readonly name: string
  readonly latest: number
  readonly versions: ReadonlyArray<Provider>
}

type StoreError = NatsError | Kv.KvValueInvalid
type Fx<A> = Effect.Effect<A, StoreError | ApiError>

/** KV keys of the store. */
export const providerKeys = {
  // <acc>.<prv>
  head: (account: string, id: string) => `${account}.${id}`,
  // <acc>.*
  headsOf: (account: string) => `${account}.*`,
  // <acc>.<prv>.<n>
  version: (account: string, id: string, n: number) => `${account}.${id}.${n}`,
  // <acc>.<prv>.*
  versionsOf: (account: string, id: string) => `${account}.${id}.*`,
} as const

/** What the store offers. */
export interface ProvidersService {
  /** Stores version 1 of a new provider (`provider.version` must be 1). */
  readonly create: (version: ProviderVersion) => Fx<Provider>
  /** Stores the next version of an existing provider, numbered by the store. */
  readonly publish: (account: AccountId, id: ProviderId, make: (n: number) => ProviderVersion) => Fx<Provider>
  /** The provider's head, or none when the account has no such provider. */
  readonly head: (account: string, id: string) => Effect.Effect<Option.Option<ProviderHead>, StoreError>
  /** Every provider head of the account. */
  readonly heads: (account: string) => Effect.Effect<ReadonlyArray<ProviderHead>, StoreError>
  /** One stored version, or none. */
  readonly version: (
    account: string,
    id: string,
    n: number,
  ) => Effect.Effect<Option.Option<ProviderVersion>, StoreError>
  /** The account's providers with their versions, newest provider first, versions newest first. */
  readonly list: (account: string) => Effect.Effect<ReadonlyArray<ProviderListing>, StoreError>
  /**
   * A provider reference as published (`prv_<id>@<n>`, `prv_<id>@latest`, a name with the same
   * forms, `none`) as a version stores it (`prv_<id>@…` or `none`). Refused with `400` naming
   * `provider` when the provider or version does not exist or a name is unknown or shared.
   */
  readonly resolve: (account: string, ref: string) => Fx<ProviderRef>
  /** The account's only provider at `@latest`; refused naming `provider` with none or several. */
  readonly only: (account: string) => Fx<ProviderRef>
}

/** The provider store. */
export class Providers extends Context.Tag("hangar/Providers")<Providers, ProvidersService>() {}

const isProviderId = Schema.is(ProviderIdSchema)
const refused = (message: string) => ApiError.invalidRequest(`provider: ${message}`)

/** Builds the store over the storage map's `providers` bucket. */
export const make: Effect.Effect<ProvidersService, NatsError, Nats | Storage> = Effect.gen(function* () {
  const { names } = yield* Storage
  const bucket = names.kv.providers.name
  const heads = yield* Kv.make(bucket, ProviderHead)
  const versions = yield* Kv.make(bucket, ProviderVersion)

  const head: ProvidersService["head"] = (account, id) =>
    isProviderId(id)
      ? Effect.map(
          heads.get(providerKeys.head(account, id)),
          Option.map((e) => e.value),
        )
      : Effect.succeed(Option.none())

  const version: ProvidersService["version"] = (account, id, n) =>
    isProviderId(id) && Number.isSafeInteger(n) && n >= 1
      ? Effect.map(
          versions.get(providerKeys.version(account, id, n)),
          Option.map((e) => e.value),
        )
      : Effect.succeed(Option.none())

  const create: ProvidersService["create"] = (v) =>
    Effect.gen(function* () {
      const p = v.provider
      yield* versions.create(providerKeys.version(v.account, p.id, 1), v)
      yield* heads.create(providerKeys.head(v.account, p.id), {
        id: p.id,
        account: v.account,
        name: p.name,
        latest: 1,
        created_at: p.created_at,
        updated_at: p.created_at,
      })
      return p
    }).pipe(Effect.catchTag("StateConflict", () => Effect.fail(ApiError.conflict())))

  const publish: ProvidersService["publish"] = (account, id, makeVersion) =>
    Effect.map(
      appendVersion({
        what: "provider",
        heads,
        headKey: providerKeys.head(account, id),
        latestOf: (h) => h.latest,
        versions,
        versionKey: (n) => providerKeys.version(account, id, n),
        make: makeVersion,
        advance: (h, n, v) => ({ ...h, latest: n, updated_at: v.provider.created_at }),
      }),
      (v) => v.provider,
    )

  const headsOf: ProvidersService["heads"] = (account) =>
    Effect.map(valuesOf(heads, providerKeys.headsOf(account)), (hs) =>
      hs.filter((h) => h.account === account),
    )

  const list: ProvidersService["list"] = (account) =>
    Effect.gen(function* () {
      const hs = yield* headsOf(account)
      const items = yield* Effect.forEach(
        hs,
        (h) =>
          Effect.map(valuesOf(versions, providerKeys.versionsOf(account, h.id)), (vs) => ({
            id: h.id,
            name: h.name,
            // A version written by a publisher that died before moving the head still counts.
            latest: Math.max(h.latest, ...vs.map((v) => v.provider.version)),
            versions: vs.map((v) => v.provider).sort((a, b) => b.version - a.version),
          })),
        { concurrency: 8 },
      )
      // Ids are time-ordered: newest provider first.
      return items.sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0))
    })

  const resolve: ProvidersService["resolve"] = (account, ref) =>
    Effect.gen(function* () {
      if (ref === noProvider) return ref as ProviderRef
      const parsed = parseProviderRef(ref)
      let id: ProviderId
      if (parsed.isId) {
        const found = yield* head(account, parsed.provider)
        if (Option.isNone(found))
          return yield* Effect.fail(refused(`no provider ${parsed.provider} in this account`))
        id = found.value.id
      } else {
        const named = (yield* headsOf(account)).filter((h) => h.name === parsed.provider)
        if (named.length === 0)
          return yield* Effect.fail(refused(`no provider is named ${JSON.stringify(parsed.provider)}`))
        if (named.length > 1)
          return yield* Effect.fail(
            refused(
              `${named.length} providers are named ${JSON.stringify(parsed.provider)}; use the prv_ id (${named.map((h) => h.id).join(", ")})`,
            ),
          )
        id = named[0]!.id
      }
      if (parsed.version !== "latest" && Option.isNone(yield* version(account, id, parsed.version)))
        return yield* Effect.fail(refused(`provider ${id} has no version ${parsed.version}`))
      return providerRef(id, parsed.version)
    })

  const only: ProvidersService["only"] = (account) =>
    Effect.gen(function* () {
      const hs = yield* headsOf(account)
      if (hs.length === 0)
        return yield* Effect.fail(refused('is required: the account has no provider (or give "none")'))
      if (hs.length > 1)
        return yield* Effect.fail(refused(`is required: the account has ${hs.length} providers; name one`))
      return providerRef(hs[0]!.id, "latest")
    })

  return { create, publish, head, heads: headsOf, version, list, resolve, only } satisfies ProvidersService
})

/** The store as a layer. */
export const layer: Layer.Layer<Providers, NatsError, Nats | Storage> = Layer.effect(Providers, make)
