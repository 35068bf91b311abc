/**
 * What the auth step reads on every request, from memory: key records by token hash, account
 * records, people by e-mail and memberships, each a `core/KvCache.ts` over its KV view. A revoked
 * key or a suspended account written through any gateway takes effect on every gateway as soon as
 * NATS pushes the write to its watch.
 */
import { Context, Effect, Layer, type Option } from "effect"
import { type AccountRecord, Accounts, type KeyRecord, keysOf, type UserRecord } from "../../core/Accounts.ts"
import type { KvValueInvalid } from "../../core/Kv.ts"
import * as KvCache from "../../core/KvCache.ts"
import type { NatsError } from "../../core/Nats.ts"
import type { Member } from "../../schema/Account.ts"

type Read<A> = Effect.Effect<Option.Option<A>, NatsError | KvValueInvalid>
/** What a read answers from memory; `undefined` when it would have to ask KV. */
type Known<A> = Option.Option<A> | undefined

/** Cached reads for the auth step. */
export class KeyCache extends Context.Tag("gateway/KeyCache")<
  KeyCache,
  {
    /** The key stored under `hash`, or none. */
    readonly lookup: (hash: string) => Read<KeyRecord>
    /** The account record, or none. */
    readonly account: (id: string) => Read<AccountRecord>
    /** The person known by `email` (lower-cased), or none. */
    readonly user: (email: string) => Read<UserRecord>
    /** The membership of `user` in `account`, or none. */
    readonly member: (account: string, user: string) => Read<Member>
    /** The same reads from memory only, synchronously (`undefined`: not known without KV). */
    readonly now: {
      readonly lookup: (hash: string) => Known<KeyRecord>
      readonly account: (id: string) => Known<AccountRecord>
      readonly user: (email: string) => Known<UserRecord>
      readonly member: (account: string, user: string) => Known<Member>
    }
    /** Completes once this gateway sees the key stored under `hash` revoked (at most `timeoutMs`). */
    readonly revoked: (hash: string, timeoutMs: number) => Effect.Effect<void>
    /** Completes once this gateway sees `user` gone from `account` (at most `timeoutMs`). */
    readonly memberGone: (account: string, user: string, timeoutMs: number) => Effect.Effect<void>
  }
>() {}

/** Builds the caches and starts their watches for the life of the layer. */
export const make = Effect.gen(function* () {
  const { views } = yield* Accounts
  const [keys, accounts, users, members] = yield* Effect.all(
    [
      KvCache.make(views.keys, keysOf.keyHash(">")),
      KvCache.make(views.accounts),
      KvCache.make(views.users, keysOf.users),
      KvCache.make(views.members, keysOf.members),
    ],
    { concurrency: "unbounded" },
  )
  return {
    lookup: (hash) => keys.get(keysOf.keyHash(hash)),
    account: (id) => accounts.get(id),
    user: (email) => users.get(keysOf.user(email)),
    member: (account, user) => members.get(keysOf.member(account, user)),
    now: {
      lookup: (hash) => keys.peek(keysOf.keyHash(hash)),
      account: (id) => accounts.peek(id),
      user: (email) => users.peek(keysOf.user(email)),
      member: (account, user) => members.peek(keysOf.member(account, user)),
    },
    revoked: (hash, timeoutMs) =>
      keys.settled(keysOf.keyHash(hash), (k) => k === undefined || k.key.revoked_at !== undefined, timeoutMs),
    memberGone: (account, user, timeoutMs) =>
      members.settled(keysOf.member(account, user), (m) => m === undefined, timeoutMs),
  } satisfies Context.Tag.Service<KeyCache>
})

/** The caches as a layer (their watches run until the layer's scope closes). */
export const layer = Layer.scoped(KeyCache, make)
