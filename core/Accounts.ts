/**
 * The account store: accounts, people (users), memberships, invites and account keys in the KV
 * buckets `accounts`, `members`, `invites` and `keys`. The gateway reads and writes it; the account
 * actor will read it too, so it lives in `core/`.
 *
 * Key scheme (every KV key is `[-/_=.A-Za-z0-9]`, so e-mail addresses are written as the base64url
 * of the lower-cased address, `b64(email)` below):
 *
 * | bucket     | key                        | value                                         |
 * |------------|----------------------------|-----------------------------------------------|
 * | `accounts` | `<acc_id>`                 | `AccountRecord`                               |
 * | `members`  | `user.<b64(email)>`        | `UserRecord`: the person's `usr_` id          |
 * | `members`  | `member.<acc_id>.<usr_id>` | `Member`                                      |
 * | `invites`  | `<acc_id>.<b64(email)>`    | `Invite` (bucket max age 7 days; reads check `expires_at`) |
 * | `keys`     | `hash.<sha256 hex>`        | `KeyRecord`: the `Key` (revocation is a write here) |
 * | `keys`     | `id.<acc_id>.<key_id>`     | `KeyIndex`: the hash, for listing and revoking |
 *
 * Every write is compare-and-set (`create`, or `update` with the revision read). A lost race is
 * retried from a fresh read a few times, then answered `409 conflict`.
 *
 * "An account keeps one owner": the account record lists its owners (`owners`), and removing an
 * owner first takes them out of that list by CAS, refusing to empty it. Two owners removing each
 * other at once therefore cannot both succeed.
 */
import { Clock, Context, Effect, Layer, Option, Schema } from "effect"
import { AccountLimits, AccountState, Invite, Key, Member, type Role } from "../schema/Account.ts"
import { Timestamp, timestamp } from "../schema/Common.ts"
import type { Size } from "../schema/Definition.ts"
import { ApiError } from "../schema/Errors.ts"
import { AccountId, type KeyId, UserId } from "../schema/Ids.ts"
import { computeRateUsdNanosPerGibHour, sizes } from "../schema/Limits.ts"
import { makeId } from "./Ids.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"

/** An account as stored. Balance and ledger belong to the account actor (later work). */
export const AccountRecord = Schema.Struct({
  id: AccountId,
  name: Schema.String,
  state: AccountState,
  limits: AccountLimits,
  owners: Schema.Array(UserId),
  created_at: Timestamp,
  webhook_public_key: Schema.optional(Schema.String),
})
export type AccountRecord = typeof AccountRecord.Type

/** A person known to the service: their e-mail (lower-cased) and `usr_` id. */
export const UserRecord = Schema.Struct({ user: UserId, email: Schema.String, created_at: Timestamp })
export type UserRecord = typeof UserRecord.Type

/** A key as stored under its token's hash. */
export const KeyRecord = Schema.Struct({ key: Key, hash: Schema.String })
export type KeyRecord = typeof KeyRecord.Type

/** The id index of a key: which hash holds it. */
export const KeyIndex = Schema.Struct({ hash: Schema.String })
export type KeyIndex = typeof KeyIndex.Type

/** The memory limit a new account starts with (every size fits twice). */
export const defaultLimits: AccountLimits = {
  memory_mib: 32 * 1024,
  sizes: Object.keys(sizes) as Array<Size>,
}

/** The compute price every account pays for now. */
export const computeRate = computeRateUsdNanosPerGibHour

/** How long an invite lasts. */
export const inviteSeconds = 7 * 24 * 60 * 60

/** The KV key form of an e-mail address (lower-cased, base64url). */
export const emailKey = (email: string): string => Buffer.from(email.toLowerCase()).toString("base64url")

/** KV keys of the store (see the module comment). */
export const keysOf = {
  // user.<b64(email)>
  user: (email: string) => `user.${emailKey(email)}`,
  // user.>
  users: "user.>",
  // member.>
  members: "member.>",
  // member.<acc>.<usr>
  member: (account: string, user: string) => `member.${account}.${user}`,
  // member.<acc>.*
  membersOf: (account: string) => `member.${account}.*`,
  // member.*.<usr>
  membershipsOf: (user: string) => `member.*.${user}`,
  // <acc>.<b64(email)>
  invite: (account: string, email: string) => `${account}.${emailKey(email)}`,
  // <acc>.*
  invitesOf: (account: string) => `${account}.*`,
  // *.<b64(email)>
  invitesFor: (email: string) => `*.${emailKey(email)}`,
  // hash.<sha256 hex>
  keyHash: (hash: string) => `hash.${hash}`,
  // id.<acc>.<key>
  keyId: (account: string, id: string) => `id.${account}.${id}`,
  // id.<acc>.*
  keyIdsOf: (account: string) => `id.${account}.*`,
} as const

type StoreError = NatsError | Kv.KvValueInvalid
type Fx<A> = Effect.Effect<A, StoreError | ApiError>

/** The typed views of the four buckets. */
export interface Views {
  readonly accounts: Kv.Kv<AccountRecord>
  readonly users: Kv.Kv<UserRecord>
  readonly members: Kv.Kv<Member>
  readonly invites: Kv.Kv<Invite>
  readonly keys: Kv.Kv<KeyRecord>
  readonly keyIndex: Kv.Kv<KeyIndex>
}

/** What the store offers. */
export interface AccountsService {
  readonly views: Views
  /** The account, or none. */
  readonly account: (id: string) => Effect.Effect<Option.Option<AccountRecord>, StoreError>
  /** Creates an account with `ownerEmail` as its only owner (the person is created if new). */
  readonly createAccount: (
    name: string,
    ownerEmail: string,
  ) => Fx<{ readonly account: AccountRecord; readonly owner: Member }>
  /** Sets the account's state; `not_found` when there is no such account. */
  readonly setState: (id: string, state: AccountState) => Fx<AccountRecord>
  /** The person with this e-mail, created (with a fresh `usr_` id) on first sight; idempotent. */
  readonly ensureUser: (email: string) => Fx<UserRecord>
  /** The membership of `user` in `account`, or none. */
  readonly member: (account: string, user: string) => Effect.Effect<Option.Option<Member>, StoreError>
  /** Every member of the account, oldest first. */
  readonly members: (account: string) => Effect.Effect<ReadonlyArray<Member>, StoreError>
  /** Every membership of the person. */
  readonly memberships: (user: string) => Effect.Effect<ReadonlyArray<Member>, StoreError>
  /** Removes a member; refuses to remove the account's last owner (`invalid_request`). */
  readonly removeMember: (account: string, user: string) => Fx<void>
  /** Writes (or renews) the invite of `email`; refused when the person is a member already. */
  readonly invite: (account: AccountRecord, email: string, role: Role, invitedBy: string) => Fx<Invite>
  /** Stores an invite as given (tests: an invite with a past `expires_at`). */
  readonly putInvite: (invite: Invite) => Effect.Effect<void, StoreError>
  /** The account's invites that have not expired. */
  readonly invites: (account: string) => Effect.Effect<ReadonlyArray<Invite>, StoreError>
  /** The invites waiting for this e-mail address that have not expired. */
  readonly invitesFor: (email: string) => Effect.Effect<ReadonlyArray<Invite>, StoreError>
  /** Cancels the invite; `not_found` when there is none (or it has expired). */
  readonly cancelInvite: (account: string, email: string) => Fx<void>
  /** Turns the person's invite into a membership; `not_found` without a live invite. */
  readonly acceptInvite: (account: string, user: UserRecord) => Fx<Member>
  /** Stores a new key under its token's hash (index first, so no stored key is ever unlisted). */
  readonly createKey: (key: Key, hash: string) => Fx<void>
  /** The key record under this hash with its revision, or none. */
  readonly keyByHash: (hash: string) => Effect.Effect<Option.Option<Kv.KvEntry<KeyRecord>>, StoreError>
  /** The account's keys, revoked ones included, oldest first. */
  readonly keys: (account: string) => Effect.Effect<ReadonlyArray<Key>, StoreError>
  /**
   * Marks the key revoked (idempotent); `not_found` when the account has no such key. Answers the
   * key and the hash it is stored under.
   */
  readonly revokeKey: (
    account: string,
    id: string,
    by: string,
  ) => Fx<{ readonly key: Key; readonly hash: string }>
}

/** The account store. */
export class Accounts extends Context.Tag("hangar/Accounts")<Accounts, AccountsService>() {}

const nowMs = Clock.currentTimeMillis
const nowSeconds = Effect.map(nowMs, (ms) => Math.floor(ms / 1000))

/** Retries `attempt` when it loses a CAS race; after `times` losses the caller gets `409 conflict`. */
export const retryConflicts = <A, E, R>(
  attempt: Effect.Effect<A, E | Kv.StateConflict, R>,
  times = 5,
): Effect.Effect<A, E | ApiError, R> =>
  attempt.pipe(
    Effect.retry({ times, while: (e) => (e as { _tag?: string })._tag === "StateConflict" }),
    Effect.catchIf(
      (e): e is Kv.StateConflict => (e as { _tag?: string })._tag === "StateConflict",
      () => Effect.fail(ApiError.conflict()),
    ),
  ) as Effect.Effect<A, E | ApiError, R>

const values = <A>(kv: Kv.Kv<A>, filter: string): Effect.Effect<ReadonlyArray<A>, StoreError> =>
  Effect.flatMap(kv.keys(filter), (keys) =>
    Effect.forEach(
      keys,
      (k) =>
        Effect.map(
          kv.get(k),
          Option.map((e) => e.value),
        ),
      { concurrency: 8 },
    ),
  ).pipe(Effect.map((found) => found.flatMap((o) => (Option.isSome(o) ? [o.value] : []))))

/** Builds the store over the storage map's buckets. */
export const make: Effect.Effect<AccountsService, NatsError, Nats | Storage> = Effect.gen(function* () {
  const { names } = yield* Storage
  const views: Views = {
    accounts: yield* Kv.make(names.kv.accounts.name, AccountRecord),
    users: yield* Kv.make(names.kv.members.name, UserRecord),
    members: yield* Kv.make(names.kv.members.name, Member),
    invites: yield* Kv.make(names.kv.invites.name, Invite),
    keys: yield* Kv.make(names.kv.keys.name, KeyRecord),
    keyIndex: yield* Kv.make(names.kv.keys.name, KeyIndex),
  }

  const account: AccountsService["account"] = (id) =>
    Effect.map(
      views.accounts.get(id),
      Option.map((e) => e.value),
    )

  const ensureUser: AccountsService["ensureUser"] = (raw) => {
    const email = raw.toLowerCase()
    const key = keysOf.user(email)
    return retryConflicts(
      Effect.gen(function* () {
        const found = yield* views.users.get(key)
        if (Option.isSome(found)) return found.value.value
        const record: UserRecord = {
          user: makeId("usr") as UserId,
          email,
          created_at: timestamp(yield* nowMs),
        }
        yield* views.users.create(key, record)
        return record
      }),
    )
  }

  const member: AccountsService["member"] = (acc, user) =>
    Effect.map(
      views.members.get(keysOf.member(acc, user)),
      Option.map((e) => e.value),
    )

  const byJoined = (ms: ReadonlyArray<Member>) =>
    [...ms].sort((a, b) => a.joined_at.localeCompare(b.joined_at))

  const createAccount: AccountsService["createAccount"] = (name, ownerEmail) =>
    Effect.gen(function* () {
      const user = yield* ensureUser(ownerEmail)
      const at = timestamp(yield* nowMs)
      const id = makeId("acc") as AccountId
      const record: AccountRecord = {
        id,
        name,
        state: "active",
        limits: defaultLimits,
        owners: [user.user],
        created_at: at,
      }
      const owner: Member = { account: id, user: user.user, email: user.email, role: "owner", joined_at: at }
      // The membership first: an account record without its owner's membership would be unreachable.
      yield* retryConflicts(views.members.create(keysOf.member(id, user.user), owner))
      yield* retryConflicts(views.accounts.create(id, record))
      return { account: record, owner }
    })

  const modifyAccount = (id: string, f: (a: AccountRecord) => Effect.Effect<AccountRecord, ApiError>) =>
    retryConflicts(
      Effect.gen(function* () {
        const found = yield* views.accounts.get(id)
        if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("account"))
        const next = yield* f(found.value.value)
        yield* views.accounts.update(id, next, found.value.revision)
        return next
      }),
    )

  const setState: AccountsService["setState"] = (id, state) =>
    modifyAccount(id, (a) => Effect.succeed({ ...a, state }))

  const removeMember: AccountsService["removeMember"] = (acc, user) =>
    Effect.gen(function* () {
      const key = keysOf.member(acc, user)
      const found = yield* views.members.get(key)
      if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("member"))
      if (found.value.value.role === "owner") {
        yield* modifyAccount(acc, (a) =>
          a.owners.length <= 1 && a.owners.includes(user as UserId)
            ? Effect.fail(ApiError.invalidRequest("user: an account keeps one owner; this is its only owner"))
            : Effect.succeed({ ...a, owners: a.owners.filter((o) => o !== user) }),
        )
      }
      yield* views.members.delete(key).pipe(Effect.catchTag("StateConflict", () => Effect.void))
    })

  const live = (now: number) => (i: Invite) => i.expires_at > now

  const getInvite = (acc: string, email: string) =>
    Effect.gen(function* () {
      const found = yield* views.invites.get(keysOf.invite(acc, email))
      const now = yield* nowSeconds
      return Option.filter(found, (e) => live(now)(e.value))
    })

  const invite: AccountsService["invite"] = (acc, raw, role, invitedBy) =>
    Effect.gen(function* () {
      const email = raw.toLowerCase()
      const known = yield* views.users.get(keysOf.user(email))
      if (Option.isSome(known) && Option.isSome(yield* member(acc.id, known.value.value.user))) {
        return yield* Effect.fail(ApiError.invalidRequest("email: already a member of this account"))
      }
      const ms = yield* nowMs
      const record: Invite = {
        email,
        account: acc.id,
        account_name: acc.name,
        role,
        invited_by: invitedBy as UserId,
        created_at: timestamp(ms),
        expires_at: Math.floor(ms / 1000) + inviteSeconds,
      }
      const key = keysOf.invite(acc.id, email)
      // A second invite for the same address renews it (new role, new 7 days).
      yield* retryConflicts(
        Effect.flatMap(views.invites.get(key), (found) =>
          views.invites.update(key, record, Option.isSome(found) ? found.value.revision : 0),
        ),
      )
      return record
    })

  const putInvite: AccountsService["putInvite"] = (i) =>
    Effect.asVoid(views.invites.put(keysOf.invite(i.account, i.email), i))

  const invites: AccountsService["invites"] = (acc) =>
    Effect.zipWith(values(views.invites, keysOf.invitesOf(acc)), nowSeconds, (all, now) =>
      all.filter(live(now)).sort((a, b) => a.created_at.localeCompare(b.created_at)),
    )

  const invitesFor: AccountsService["invitesFor"] = (email) =>
    Effect.zipWith(values(views.invites, keysOf.invitesFor(email)), nowSeconds, (all, now) =>
      all.filter(live(now)),
    )

  const cancelInvite: AccountsService["cancelInvite"] = (acc, email) =>
    Effect.gen(function* () {
      const found = yield* views.invites.get(keysOf.invite(acc, email))
      const now = yield* nowSeconds
      if (Option.isNone(found) || !live(now)(found.value.value))
        return yield* Effect.fail(ApiError.notFound("invite"))
      yield* views.invites
        .delete(keysOf.invite(acc, email), { revision: found.value.revision })
        .pipe(Effect.catchTag("StateConflict", () => Effect.fail(ApiError.conflict())))
    })

  const acceptInvite: AccountsService["acceptInvite"] = (acc, user) =>
    Effect.gen(function* () {
      const key = keysOf.invite(acc, user.email)
      const found = yield* getInvite(acc, user.email)
      if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("invite"))
      const inv = found.value.value
      const accountRecord = yield* account(acc)
      if (Option.isNone(accountRecord)) return yield* Effect.fail(ApiError.notFound("invite"))
      if (accountRecord.value.state === "suspended") return yield* Effect.fail(ApiError.suspended())
      const existing = yield* member(acc, user.user)
      const joined: Member = Option.isSome(existing)
        ? existing.value
        : {
            account: inv.account,
            user: user.user,
            email: user.email,
            role: inv.role,
            joined_at: timestamp(yield* nowMs),
            invited_by: inv.invited_by,
          }
      if (Option.isNone(existing)) {
        yield* views.members
          .create(keysOf.member(acc, user.user), joined)
          .pipe(Effect.catchTag("StateConflict", () => Effect.fail(ApiError.conflict())))
        if (joined.role === "owner") {
          yield* modifyAccount(acc, (a) =>
            Effect.succeed(a.owners.includes(user.user) ? a : { ...a, owners: [...a.owners, user.user] }),
          )
        }
      }
      // The invite is used up; a concurrent renewal keeps its newer value.
      yield* views.invites
        .delete(key, { revision: found.value.revision })
        .pipe(Effect.catchTag("StateConflict", () => Effect.void))
      return joined
    })

  const createKey: AccountsService["createKey"] = (key, hash) =>
    Effect.gen(function* () {
      yield* retryConflicts(views.keyIndex.create(keysOf.keyId(key.account, key.id), { hash }))
      yield* retryConflicts(views.keys.create(keysOf.keyHash(hash), { key, hash }))
    })

  const keyByHash: AccountsService["keyByHash"] = (hash) => views.keys.get(keysOf.keyHash(hash))

  const keys: AccountsService["keys"] = (acc) =>
    Effect.gen(function* () {
      const index = yield* values(views.keyIndex, keysOf.keyIdsOf(acc))
      const found = yield* Effect.forEach(index, (i) => keyByHash(i.hash), { concurrency: 8 })
      return found
        .flatMap((o) => (Option.isSome(o) ? [o.value.value.key] : []))
        .sort((a, b) => a.id.localeCompare(b.id))
    })

  const revokeKey: AccountsService["revokeKey"] = (acc, id, by) =>
    Effect.gen(function* () {
      const index = yield* views.keyIndex.get(keysOf.keyId(acc, id))
      if (Option.isNone(index)) return yield* Effect.fail(ApiError.notFound("key"))
      const hash = index.value.value.hash
      const hashKey = keysOf.keyHash(hash)
      const key = yield* retryConflicts(
        Effect.gen(function* () {
          const found = yield* views.keys.get(hashKey)
          if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("key"))
          const current = found.value.value.key
          if (current.revoked_at !== undefined) return current
          const revoked: Key = { ...current, revoked_at: timestamp(yield* nowMs), revoked_by: by as UserId }
          yield* views.keys.update(hashKey, { ...found.value.value, key: revoked }, found.value.revision)
          return revoked
        }),
      )
      return { key, hash }
    })

  return {
    views,
    account,
    createAccount,
    setState,
    ensureUser,
    member,
    members: (acc) => Effect.map(values(views.members, keysOf.membersOf(acc)), byJoined),
    memberships: (user) => values(views.members, keysOf.membershipsOf(user)),
    removeMember,
    invite,
    putInvite,
    invites,
    invitesFor,
    cancelInvite,
    acceptInvite,
    createKey,
    keyByHash,
    keys,
    revokeKey,
  } satisfies AccountsService
})

/** The store as a layer. */
export const layer: Layer.Layer<Accounts, NatsError, Nats | Storage> = Layer.effect(Accounts, make)

/** The `usr_` id type, re-exported for callers that build principals. */
export type { KeyId, UserId }
