/**
 * Access labels and principals. A route declares one access label (spec "Endpoints"); the auth
 * step turns the request's credential into the principal that label promises, or refuses it:
 *
 * | label                 | who passes                              | refusals (after 401 `unauthenticated`) |
 * |-----------------------|-----------------------------------------|----------------------------------------|
 * | `anyone`              | everyone; credentials are not read      | none                                   |
 * | `signed in`           | a person; no account needed             | key: 403 `people_only`                 |
 * | `person`              | a member person of `Service-Account`    | key: `people_only`; no header: 400 `account_required`; not a member: 403 `not_a_member` |
 * | `owner`               | an owner person of `Service-Account`    | as `person`, and a member: 403 `owners_only` |
 * | `member`              | a member person, or a key of the account | as `person` for people                |
 * | `member (admin keys)` | as `member`, keys of scope `admin` only | run key: 403 `key_scope`               |
 *
 * A suspended account answers 403 `suspended` on the routes that do not say `whileSuspended`
 * (by default: every route but `GET` ones, so people still read their account, members, keys and
 * usage, and keys can still read runs; nothing new starts or is created).
 */
import type { AccountRecord } from "../../core/Accounts.ts"
import type { Key, Role } from "../../schema/Account.ts"
import type { UserId } from "../../schema/Ids.ts"

/** The access labels of the spec's endpoint table. */
export const accessLabels = [
  "anyone",
  "signed in",
  "person",
  "owner",
  "member",
  "member (admin keys)",
] as const
/** One access label. */
export type Access = (typeof accessLabels)[number]

/**
 * Where account keys may go: the path prefixes of the `member` routes (a test checks it against the
 * gateway's route table). A key refused with `people_only` is told these.
 */
export const keyRoutePrefixes = [
  "/v1/bases",
  "/v1/catalog",
  "/v1/files",
  "/v1/functions",
  "/v1/providers",
  "/v1/runs",
  "/v1/tools",
  "/v1/webhooks/public-key",
] as const

/** The `people_only` refusal of a key, naming the routes a key may use. */
export const peopleOnlyForKeys = `this route is for people signed in, not account keys; a key may use ${keyRoutePrefixes.slice(0, -1).join(", ")} and ${keyRoutePrefixes.at(-1)}`

/** No credential was asked for. */
export interface Anyone {
  readonly _tag: "Anyone"
}

/** A person signed in, outside any account. */
export interface Person {
  readonly _tag: "Person"
  readonly user: UserId
  readonly email: string
}

/** A person acting in an account they belong to (named by `Service-Account`). */
export interface AccountPerson {
  readonly _tag: "AccountPerson"
  readonly user: UserId
  readonly email: string
  readonly account: AccountRecord
  readonly role: Role
}

/** An account key (never revoked at the time of the request). */
export interface AccountKey {
  readonly _tag: "AccountKey"
  readonly key: Key
  readonly account: AccountRecord
}

/** Whoever made a request. */
export type Principal = Anyone | Person | AccountPerson | AccountKey

/** The principal a handler receives for each access label. */
export interface PrincipalOf {
  readonly anyone: Anyone
  readonly "signed in": Person
  readonly person: AccountPerson
  readonly owner: AccountPerson & { readonly role: "owner" }
  readonly member: AccountPerson | AccountKey
  readonly "member (admin keys)": AccountPerson | (AccountKey & { readonly key: { readonly scope: "admin" } })
}

/** The principal type of access label `A`. */
export type PrincipalFor<A extends Access> = PrincipalOf[A]

/** Who acted, as records name it (`created_by`, `invited_by`, `started_by`): the user or the key. */
export const actorOf = (p: Person | AccountPerson | AccountKey): string =>
  p._tag === "AccountKey" ? p.key.id : p.user
