/**
 * CLI logins (spec "Authentication" 7): the CLI makes a key token, keeps its secret and starts a
 * login with the token's SHA-256; an owner approves it in the console after comparing the code
 * the CLI shows; the approval stores an admin key named after the machine under that hash, so the
 * CLI's own token authenticates from then on. Nothing secret is ever stored or answered.
 *
 * Storage: KV `logins`, key `<login_id>`, value `CliLoginRecord` (bucket max age 1 day, so a
 * login's id answers 404 a day after its last write). States: `pending` until approved or until
 * `expires_at` (10 minutes after creation), then `approved` or `expired`; `expired` is computed at
 * read time, never written.
 *
 * Approval is compare-and-set on the login record: the approval that moves it to `approved` wins
 * and is the only one that creates the key; a later approval by the same account answers the
 * approved login (creating the key only if the winner stopped before storing it); a wrong code is
 * refused and leaves the login pending.
 */
import { randomInt } from "node:crypto"
import { Clock, Context, Effect, Layer, Option, Schema } from "effect"
import { Accounts, retryConflicts } from "../../core/Accounts.ts"
import { defineSettings, env } from "../../core/Config.ts"
import { makeId } from "../../core/Ids.ts"
import { sameHash } from "../../core/KeyTokens.ts"
import * as Kv from "../../core/Kv.ts"
import type { Nats, NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import type { CliLogin, CliLoginRequest, Key } from "../../schema/Account.ts"
import { Count, Timestamp, timestamp } from "../../schema/Common.ts"
import { ApiError } from "../../schema/Errors.ts"
import { AccountId, CliLoginId, KeyId, UserId } from "../../schema/Ids.ts"
import { cliLoginValidMs } from "../../schema/Limits.ts"

/** Where approval pages live and how long a login waits for approval. */
export const CliLoginSettings = defineSettings(
  "gateway/CliLoginSettings",
  {
    /** The console's base address; a login's approval page is `<consoleUrl>/cli-logins/<id>?code=<code>`. */
    consoleUrl: "http://127.0.0.1:8080",
    /** How long a login may wait for approval (the spec's 10 minutes). */
    validMs: cliLoginValidMs,
  },
  () => ({ consoleUrl: env.string("CONSOLE_URL", "http://127.0.0.1:8080") }),
)

/** A login as stored. `approved_*` are set together when an owner approves it. */
export const CliLoginRecord = Schema.Struct({
  id: CliLoginId,
  name: Schema.String,
  key_hash: Schema.String,
  code: Schema.String,
  created_at: Timestamp,
  /** Unix seconds. */
  expires_at: Count,
  approved: Schema.optional(
    Schema.Struct({
      account: AccountId,
      key: KeyId,
      by: UserId,
      at: Timestamp,
    }),
  ),
})
export type CliLoginRecord = typeof CliLoginRecord.Type

// Crockford-like: no I, L, O, U, 0, 1, so a code read aloud or retyped is not misread.
const codeAlphabet = "ABCDEFGHJKMNPQRSTVWXYZ23456789"

/** A fresh code, `XXXX-XXXX` from an unambiguous alphabet (about 39 bits). */
export const newCode = (): string => {
  let s = ""
  for (let i = 0; i < 8; i++) s += codeAlphabet[randomInt(codeAlphabet.length)]
  return `${s.slice(0, 4)}-${s.slice(4)}`
}

/** A typed code in the form it is compared: upper case, without spaces and dashes. */
export const normalizeCode = (code: string): string => code.toUpperCase().replace(/[\s-]/g, "")

/** The answer of `GET /v1/cli-logins/{id}` for a record at time `nowMs`. */
export const view = (r: CliLoginRecord, nowMs: number): CliLogin =>
  r.approved
    ? {
        id: r.id,
        name: r.name,
        state: "approved",
        expires_at: r.expires_at,
        account: r.approved.account,
        key: r.approved.key,
      }
    : {
        id: r.id,
        name: r.name,
        state: nowMs >= r.expires_at * 1000 ? "expired" : "pending",
        expires_at: r.expires_at,
      }

type StoreError = NatsError | Kv.KvValueInvalid

/** Who approves: an owner acting in an account. */
export interface Approver {
  readonly account: AccountId
  readonly user: UserId
}

/** What the login service offers. */
export interface CliLoginsService {
  /** Starts a login; answers the record (its code and expiry). */
  readonly create: (request: CliLoginRequest) => Effect.Effect<CliLoginRecord, StoreError | ApiError>
  /** The login's state now; `not_found` when there is no such login (or it aged out). */
  readonly read: (id: string) => Effect.Effect<CliLogin, StoreError | ApiError>
  /**
   * Approves the login for the approver's account with the code the console showed: creates the
   * admin key once. Wrong code: `invalid_request` naming `code` (the login stays pending);
   * expired: `invalid_request`; approved by another account: `invalid_request`.
   */
  readonly approve: (id: string, code: string, by: Approver) => Effect.Effect<CliLogin, StoreError | ApiError>
  /** The stored record (tests read and rewrite it, e.g. to move `expires_at` into the past). */
  readonly kv: Kv.Kv<CliLoginRecord>
}

/** The CLI login service. */
export class CliLogins extends Context.Tag("gateway/CliLogins")<CliLogins, CliLoginsService>() {}

const isLoginId = Schema.is(CliLoginId)

/** Builds the service over KV `logins` and the account store. */
export const make = Effect.gen(function* () {
  const { names } = yield* Storage
  const accounts = yield* Accounts
  const settings = yield* CliLoginSettings.Tag
  const kv = yield* Kv.make(names.kv.logins.name, CliLoginRecord)

  const get = (id: string) =>
    isLoginId(id)
      ? Effect.flatMap(kv.get(id), (found) =>
          Option.isSome(found) ? Effect.succeed(found.value) : Effect.fail(ApiError.notFound("cli login")),
        )
      : Effect.fail(ApiError.notFound("cli login"))

  const create: CliLoginsService["create"] = (request) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const record: CliLoginRecord = {
        id: makeId("login") as CliLoginId,
        name: request.name,
        key_hash: request.key_hash,
        code: newCode(),
        created_at: timestamp(now),
        expires_at: Math.floor((now + settings.validMs) / 1000),
      }
      yield* retryConflicts(kv.create(record.id, record))
      return record
    })

  const read: CliLoginsService["read"] = (id) =>
    Effect.zipWith(get(id), Clock.currentTimeMillis, (entry, now) => view(entry.value, now))

  // The key of an approved login, stored under the CLI's hash unless it already is.
  const ensureKey = (r: CliLoginRecord & { approved: NonNullable<CliLoginRecord["approved"]> }) =>
    Effect.gen(function* () {
      const existing = yield* accounts.keyByHash(r.key_hash)
      if (Option.isSome(existing)) {
        if (existing.value.value.key.id === r.approved.key) return
        return yield* Effect.fail(ApiError.invalidRequest("key_hash: already belongs to another key"))
      }
      const key: Key = {
        id: r.approved.key,
        account: r.approved.account,
        name: r.name,
        scope: "admin",
        functions: ["*"],
        created_at: r.approved.at,
        created_by: r.approved.by,
      }
      // Two approvals finishing the same key at once: the loser's writes conflict, and the key the
      // winner stored is the same one.
      yield* accounts.createKey(key, r.key_hash).pipe(
        Effect.catchIf(
          (e) => e instanceof ApiError && e.code === "conflict",
          (e) =>
            Effect.flatMap(accounts.keyByHash(r.key_hash), (found) =>
              Option.isSome(found) && found.value.value.key.id === key.id ? Effect.void : Effect.fail(e),
            ),
        ),
      )
    })

  const approve: CliLoginsService["approve"] = (id, code, by) =>
    Effect.gen(function* () {
      const entry = yield* get(id)
      const r = entry.value
      const now = yield* Clock.currentTimeMillis
      if (r.approved) {
        if (r.approved.account !== by.account)
          return yield* Effect.fail(
            ApiError.invalidRequest("id: this CLI login was approved for another account"),
          )
        // Approving again answers the same login; it also finishes a key the winner did not store.
        yield* ensureKey({ ...r, approved: r.approved })
        return view(r, now)
      }
      if (now >= r.expires_at * 1000)
        return yield* Effect.fail(ApiError.invalidRequest("id: this CLI login has expired; start a new one"))
      if (!sameHash(normalizeCode(code), normalizeCode(r.code)))
        return yield* Effect.fail(ApiError.invalidRequest("code: does not match the code of this CLI login"))
      if (Option.isSome(yield* accounts.keyByHash(r.key_hash)))
        return yield* Effect.fail(ApiError.invalidRequest("key_hash: already belongs to another key"))
      const approved = { account: by.account, key: makeId("key") as KeyId, by: by.user, at: timestamp(now) }
      // The CAS decides the one approval that creates the key.
      yield* kv.update(r.id, { ...r, approved }, entry.revision)
      yield* ensureKey({ ...r, approved })
      return view({ ...r, approved }, now)
    }).pipe(retryConflicts)

  return { create, read, approve, kv } satisfies CliLoginsService
})

/** The service as a layer. */
export const layer: Layer.Layer<
  CliLogins,
  NatsError,
  Nats | Storage | Accounts | typeof CliLoginSettings.Tag.Identifier
> = Layer.effect(CliLogins, make)

/** The service and its settings read from `HANGAR_*` variables (the routes read the settings too). */
export const layerFromEnv = layer.pipe(Layer.provideMerge(CliLoginSettings.layerFromEnv))
