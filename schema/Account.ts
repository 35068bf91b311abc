/**
 * Accounts, members, invites, keys, credit and CLI logins (spec "Key", "Member", "Invite",
 * "Balance", "Ledger Entry", "Account", and the account routes).
 *
 * Integer expiry times (`Invite.expires_at`, the CLI login's `expires_at`) are Unix seconds, like
 * the `webhook-timestamp` header; date-times elsewhere are ISO 8601 strings.
 */
import { Schema } from "effect"
import {
  Count,
  Enum,
  IntAtLeast,
  IntBetween,
  maxBytes,
  NonEmptyString,
  Sha256Hex,
  Timestamp,
  UsdNanos,
} from "./Common.ts"
import { Size } from "./Definition.ts"
import { AccountId, Actor, CliLoginId, FunctionId, KeyId, LedgerEntryId, RunId, UserId } from "./Ids.ts"
import { checkoutMaxCents, checkoutMinCents, emailMaxChars, labelMaxBytes } from "./Limits.ts"

/** A member's role; an account keeps one owner. */
export const Role = Enum("owner", "member").annotations({ identifier: "Role" })
export type Role = typeof Role.Type

/** An account's state (DESIGN.md). */
export const AccountState = Enum("active", "suspended").annotations({ identifier: "AccountState" })
export type AccountState = typeof AccountState.Type

/** An e-mail address: something@domain, at most 254 characters; compared case-insensitively. */
export const Email = Schema.String.pipe(
  Schema.filter(
    (e) =>
      (e.length <= emailMaxChars && /^[^\s@]+@[^\s@]+\.[^\s@]+$/.test(e)) ||
      `must be an e-mail address of at most ${emailMaxChars} characters`,
  ),
).annotations({ identifier: "Email" })

const Label = NonEmptyString.pipe(maxBytes(labelMaxBytes))

// ---------------------------------------------------------------------------------------------
// Keys

/** A key's scope. */
export const KeyScope = Enum("admin", "run").annotations({ identifier: "KeyScope" })
export type KeyScope = typeof KeyScope.Type

/** The functions a run key may start: function ids, or `*` for every function, later ones too. */
export const KeyFunction = Schema.Union(FunctionId, Schema.Literal("*")).annotations({
  message: () => ({ message: "must be a fnc_ id or *", override: true }),
})

/** A key as listed; the secret token is never listed. */
export const Key = Schema.Struct({
  id: KeyId,
  account: AccountId,
  name: Schema.String,
  scope: KeyScope,
  functions: Schema.Array(KeyFunction),
  created_at: Timestamp,
  created_by: UserId,
  revoked_at: Schema.optional(Timestamp),
  revoked_by: Schema.optional(UserId),
}).annotations({ identifier: "Key" })
export type Key = typeof Key.Type

/**
 * `POST /v1/keys`. A run key must name its functions (`["*"]` for all); an admin key reaches every
 * function, so `functions` is left out or `["*"]` (the key is stored with `["*"]`).
 */
export const CreateKeyRequest = Schema.Struct({
  name: Label,
  scope: KeyScope,
  functions: Schema.optional(Schema.Array(KeyFunction)),
})
  .pipe(
    Schema.filter((r) => {
      const fns = r.functions
      if (r.scope === "run" && (fns === undefined || fns.length === 0))
        return { path: ["functions"], message: 'a run key must name its functions (or ["*"])' }
      if (r.scope === "admin" && fns !== undefined && !(fns.length === 1 && fns[0] === "*"))
        return { path: ["functions"], message: "an admin key reaches every function; leave functions out" }
      if (fns !== undefined && fns.length > 1 && fns.includes("*"))
        return { path: ["functions"], message: "* already means every function; give it alone" }
      return true
    }),
  )
  .annotations({ identifier: "CreateKeyRequest" })
export type CreateKeyRequest = typeof CreateKeyRequest.Type

/** The answer of `POST /v1/keys`: the token is shown this once. */
export const CreateKeyResponse = Schema.Struct({ key: Key, token: Schema.String }).annotations({
  identifier: "CreateKeyResponse",
})
export type CreateKeyResponse = typeof CreateKeyResponse.Type

/** `GET /v1/keys`. */
export const KeyList = Schema.Struct({ keys: Schema.Array(Key) })
/** `DELETE /v1/keys/{id}`. */
export const Revoked = Schema.Struct({ revoked: KeyId })

// ---------------------------------------------------------------------------------------------
// Members and invites

/** A membership; the account's founder has no `invited_by`. */
export const Member = Schema.Struct({
  account: AccountId,
  user: UserId,
  email: Schema.String,
  role: Role,
  joined_at: Timestamp,
  invited_by: Schema.optional(UserId),
}).annotations({ identifier: "Member" })
export type Member = typeof Member.Type

/** `GET /v1/members`. */
export const MemberList = Schema.Struct({ members: Schema.Array(Member) })
/** `DELETE /v1/members/{user}`. */
export const Removed = Schema.Struct({ removed: UserId })

/** An invite for an e-mail address; lasts 7 days (`expires_at` in Unix seconds). */
export const Invite = Schema.Struct({
  email: Schema.String,
  account: AccountId,
  account_name: Schema.String,
  role: Role,
  invited_by: UserId,
  created_at: Timestamp,
  expires_at: Count,
}).annotations({ identifier: "Invite" })
export type Invite = typeof Invite.Type

/** `POST /v1/invites`. */
export const CreateInviteRequest = Schema.Struct({ email: Email, role: Role }).annotations({
  identifier: "CreateInviteRequest",
})
export type CreateInviteRequest = typeof CreateInviteRequest.Type

/** `GET /v1/invites`. */
export const InviteList = Schema.Struct({ invites: Schema.Array(Invite) })
/** `DELETE /v1/invites/{email}`. */
export const Cancelled = Schema.Struct({ cancelled: Schema.String })

// ---------------------------------------------------------------------------------------------
// Credit

/** An account's balance; `available_usd_nanos` is the balance above the minimum. */
export const Balance = Schema.Struct({
  account: AccountId,
  balance_usd_nanos: UsdNanos,
  minimum_balance_usd_nanos: UsdNanos,
  currency: Schema.String,
  available_usd_nanos: UsdNanos,
}).annotations({ identifier: "Balance" })
export type Balance = typeof Balance.Type

/** What a ledger entry records. */
export const LedgerKind = Enum("compute", "purchase", "refund", "dispute", "adjustment").annotations({
  identifier: "LedgerKind",
})
export type LedgerKind = typeof LedgerKind.Type

/**
 * A ledger entry. Compute entries carry the run's fields and the minutes they bill
 * (`from_minute` to `through_minute`, counting from 1); other kinds leave those out.
 */
export const LedgerEntry = Schema.Struct({
  id: LedgerEntryId,
  account: AccountId,
  kind: LedgerKind,
  amount_usd_nanos: UsdNanos,
  effective_at: Timestamp,
  run: Schema.optional(RunId),
  function: Schema.optional(FunctionId),
  version: Schema.optional(IntAtLeast(1)),
  size: Schema.optional(Size),
  provider: Schema.optional(Schema.String),
  started_by: Schema.optional(Actor),
  external_reference: Schema.optional(Schema.String),
  from_minute: Schema.optional(IntAtLeast(1)),
  through_minute: Schema.optional(IntAtLeast(1)),
  memory_mib: Schema.optional(Count),
  rate_usd_nanos_per_gib_hour: Schema.optional(Count),
}).annotations({ identifier: "LedgerEntry" })
export type LedgerEntry = typeof LedgerEntry.Type

/** `GET /v1/usage`: the balance and the last 30 days of the ledger. */
export const UsageResponse = Schema.Struct({ balance: Balance, entries: Schema.Array(LedgerEntry) })
export type UsageResponse = typeof UsageResponse.Type

/** `POST /v1/credit/checkout`: $5 to $500, in cents. */
export const CheckoutRequest = Schema.Struct({
  amount_usd_cents: IntBetween(checkoutMinCents, checkoutMaxCents),
}).annotations({ identifier: "CheckoutRequest" })
export type CheckoutRequest = typeof CheckoutRequest.Type

/** The answer of `POST /v1/credit/checkout`: a payment page. */
export const CheckoutResponse = Schema.Struct({ url: Schema.String })

// ---------------------------------------------------------------------------------------------
// Accounts and people

/** An account's limits: memory of concurrently running runs, and the sizes it may use. */
export const AccountLimits = Schema.Struct({ memory_mib: Count, sizes: Schema.Array(Size) }).annotations({
  identifier: "AccountLimits",
})
export type AccountLimits = typeof AccountLimits.Type

/** A webhook public key: `whpk_` and the base64 Ed25519 public key. */
export const WebhookPublicKey = Schema.String.pipe(
  Schema.pattern(/^whpk_[A-Za-z0-9+/]{43}=$/, { message: () => "must be whpk_ and a base64 Ed25519 key" }),
)

/** `GET /v1/account`; `role` is the caller's role (absent for a key). */
export const Account = Schema.Struct({
  id: AccountId,
  name: Schema.String,
  state: AccountState,
  limits: AccountLimits,
  webhook_public_key: WebhookPublicKey,
  balance: Balance,
  role: Schema.optional(Role),
  compute_rate_usd_nanos_per_gib_hour: Count,
}).annotations({ identifier: "Account" })
export type Account = typeof Account.Type

/** `GET /v1/webhooks/public-key`. */
export const WebhookPublicKeys = Schema.Struct({ keys: Schema.Array(WebhookPublicKey) })

/** `GET /v1/me`: the person, their accounts and the invites waiting for them. */
export const Me = Schema.Struct({
  user: UserId,
  email: Schema.String,
  accounts: Schema.Array(
    Schema.Struct({ account: AccountId, name: Schema.String, state: AccountState, role: Role }),
  ),
  invites: Schema.Array(Invite),
}).annotations({ identifier: "Me" })
export type Me = typeof Me.Type

// ---------------------------------------------------------------------------------------------
// CLI logins

/** `POST /v1/cli-logins`: the machine's name (the key is named after it) and the SHA-256 of the key's secret. */
export const CliLoginRequest = Schema.Struct({ name: Label, key_hash: Sha256Hex }).annotations({
  identifier: "CliLoginRequest",
})
export type CliLoginRequest = typeof CliLoginRequest.Type

/** The answer of `POST /v1/cli-logins`: the code to compare and the page to approve it on. */
export const CliLoginCreated = Schema.Struct({
  id: CliLoginId,
  code: Schema.String,
  url: Schema.String,
  expires_at: Count,
}).annotations({ identifier: "CliLoginCreated" })
export type CliLoginCreated = typeof CliLoginCreated.Type

/** A CLI login's state; `expired` after 10 minutes without approval. */
export const CliLoginState = Enum("pending", "approved", "expired").annotations({
  identifier: "CliLoginState",
})
export type CliLoginState = typeof CliLoginState.Type

/** `GET /v1/cli-logins/{id}` (DESIGN.md): once approved, the account and the key id. */
export const CliLogin = Schema.Struct({
  id: CliLoginId,
  /** The machine name the CLI sent, so the approving person sees which machine asks. */
  name: Schema.String,
  state: CliLoginState,
  expires_at: Count,
  account: Schema.optional(AccountId),
  key: Schema.optional(KeyId),
}).annotations({ identifier: "CliLogin" })
export type CliLogin = typeof CliLogin.Type
