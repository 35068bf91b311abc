/**
 * Stored secrets: environment secrets and custom-tool secrets of function versions, and the vendor
 * keys of provider versions, sealed with the account's data key (`Seal`) in KV `secrets`.
 *
 * Key scheme: `<acc_id>.<sec_id>` → `StoredSecret` (the wrapped data keys of the same bucket sit
 * under `datakey.<acc_id>`, so the two never collide). The associated data of each seal binds the
 * secret id, its kind and, for a tool secret, the tool's URL: a sealed value moved to another id,
 * kind or URL does not open, so a tool secret is only ever usable for a tool at the URL it was
 * given for, and a tool or vendor secret cannot be turned into an environment variable (which would
 * put it inside the machine).
 *
 * Plain values never leave this module except from `open`, as `Redacted`.
 */
import { Context, Effect, Layer, Option, Redacted, Schema } from "effect"
import { Timestamp, timestamp } from "../schema/Common.ts"
import { AccountId, SecretId } from "../schema/Ids.ts"
import { Vendor } from "../schema/Provider.ts"
import { makeId } from "./Ids.ts"
import type { KeyringError } from "./Keyring.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { type DecryptFailed, Seal } from "./Seal.ts"
import { Storage } from "./Storage.ts"

/** What a secret is for; fixed when stored. */
export const SecretBinding = Schema.Union(
  Schema.Struct({ kind: Schema.Literal("env") }),
  Schema.Struct({ kind: Schema.Literal("tool"), url: Schema.String }),
  Schema.Struct({ kind: Schema.Literal("vendor"), vendor: Vendor }),
)
export type SecretBinding = typeof SecretBinding.Type

/** A secret as stored: its binding and the sealed value (base64 in JSON). */
export const StoredSecret = Schema.Struct({
  id: SecretId,
  account: AccountId,
  binding: SecretBinding,
  sealed: Schema.Uint8ArrayFromBase64,
  created_at: Timestamp,
})
export type StoredSecret = typeof StoredSecret.Type

/** A stored secret's description, without the sealed value. */
export type SecretInfo = Omit<StoredSecret, "sealed">

/** Store failures (the bus, a bad record, the keyring). Callers answer them as `500 internal`. */
export type SecretsError = NatsError | Kv.KvValueInvalid | Kv.StateConflict | KeyringError

/** The KV key of a secret. */
export const secretKey = (account: string, id: string): string => `${account}.${id}`

const aadOf = (id: string, binding: SecretBinding): string =>
  binding.kind === "env"
    ? `secret:${id}:env`
    : binding.kind === "tool"
      ? `secret:${id}:tool:${binding.url}`
      : `secret:${id}:vendor:${binding.vendor}`

/** What the secret store offers. */
export interface SecretsService {
  /** Seals `value` for `account` with `binding`; answers the new `sec_` id. */
  readonly store: (
    account: AccountId,
    binding: SecretBinding,
    value: Redacted.Redacted<string>,
  ) => Effect.Effect<SecretId, SecretsError>
  /** The secret's id, account and binding (never its value), or none when the account has no such secret. */
  readonly info: (account: string, id: string) => Effect.Effect<Option.Option<SecretInfo>, SecretsError>
  /** The plain value, for the process that hands it to a vendor, a tool or a machine's environment. */
  readonly open: (
    account: string,
    id: string,
  ) => Effect.Effect<Option.Option<Redacted.Redacted<string>>, SecretsError | DecryptFailed>
}

/** The secret store. */
export class Secrets extends Context.Tag("hangar/Secrets")<Secrets, SecretsService>() {}

const isSecretId = Schema.is(SecretId)
const text = new TextEncoder()
const untext = new TextDecoder()

/** Builds the store over the storage map's `secrets` bucket. */
export const make: Effect.Effect<SecretsService, NatsError, Nats | Storage | Seal> = Effect.gen(function* () {
  const { names } = yield* Storage
  const seal = yield* Seal
  const kv = yield* Kv.make(names.kv.secrets.name, StoredSecret)

  const get = (account: string, id: string) =>
    isSecretId(id)
      ? Effect.map(
          kv.get(secretKey(account, id)),
          Option.filter((e) => e.value.account === account),
        )
      : Effect.succeed(Option.none())

  const store: SecretsService["store"] = (account, binding, value) =>
    Effect.gen(function* () {
      const id = makeId("sec") as SecretId
      const plain = text.encode(Redacted.value(value))
      const sealed = yield* seal.seal(account, aadOf(id, binding), plain)
      plain.fill(0)
      yield* kv.create(secretKey(account, id), {
        id,
        account,
        binding,
        sealed,
        created_at: timestamp(Date.now()),
      })
      return id
    })

  const info: SecretsService["info"] = (account, id) =>
    Effect.map(
      get(account, id),
      Option.map(({ value: { sealed: _, ...rest } }) => rest),
    )

  const open: SecretsService["open"] = (account, id) =>
    Effect.gen(function* () {
      const found = yield* get(account, id)
      if (Option.isNone(found)) return Option.none()
      const s = found.value.value
      const plain = yield* seal.open(account, aadOf(s.id, s.binding), s.sealed)
      const value = untext.decode(plain)
      plain.fill(0)
      return Option.some(Redacted.make(value))
    })

  return { store, info, open } satisfies SecretsService
})

/** The store as a layer; needs NATS, the storage map and `Seal`. */
export const layer: Layer.Layer<Secrets, NatsError, Nats | Storage | Seal> = Layer.effect(Secrets, make)
