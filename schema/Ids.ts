/**
 * Branded identifiers, one per kind, so one kind cannot be passed for another. The shape is
 * `<prefix>_<26 characters>` as `core/Ids.ts` makes them (lowercase Crockford base32, time-ordered).
 * Also the names that are not ids: base names, function and provider names, provider references.
 */
import { Schema } from "effect"

/** The 26-character body of every id (lowercase Crockford base32: no i, l, o, u). */
export const idBody = "[0-9a-hjkmnp-tv-z]{26}"

const id = <const P extends string, const B extends string>(prefix: P, brand: B) =>
  Schema.String.pipe(
    Schema.pattern(new RegExp(`^${prefix}_${idBody}$`), {
      message: () => `must be a ${prefix}_ id (${prefix}_ and 26 lowercase base32 characters)`,
    }),
    Schema.brand(brand),
  ).annotations({ identifier: brand })

/** `fnc_<id>`: a function. */
export const FunctionId = id("fnc", "FunctionId")
export type FunctionId = typeof FunctionId.Type
/** `run_<id>`: a run. */
export const RunId = id("run", "RunId")
export type RunId = typeof RunId.Type
/** `file_<id>`: an upload. */
export const UploadId = id("file", "UploadId")
export type UploadId = typeof UploadId.Type
/** `prv_<id>`: a provider. */
export const ProviderId = id("prv", "ProviderId")
export type ProviderId = typeof ProviderId.Type
/** `sec_<id>`: a stored secret. */
export const SecretId = id("sec", "SecretId")
export type SecretId = typeof SecretId.Type
/** `cmd_<id>`: a command. */
export const CommandId = id("cmd", "CommandId")
export type CommandId = typeof CommandId.Type
/** `evt_<id>`: a webhook event. */
export const EventId = id("evt", "EventId")
export type EventId = typeof EventId.Type
/** `img_<id>`: an image made by finishing an agentless run. */
export const ImageId = id("img", "ImageId")
export type ImageId = typeof ImageId.Type
/** `acc_<id>`: an account. */
export const AccountId = id("acc", "AccountId")
export type AccountId = typeof AccountId.Type
/** `usr_<id>`: a person. */
export const UserId = id("usr", "UserId")
export type UserId = typeof UserId.Type
/** `key_<id>`: an account key (its id, not its secret token). */
export const KeyId = id("key", "KeyId")
export type KeyId = typeof KeyId.Type
/** `login_<id>`: a CLI login. */
export const CliLoginId = id("login", "CliLoginId")
export type CliLoginId = typeof CliLoginId.Type
/** `led_<id>`: a ledger entry. */
export const LedgerEntryId = id("led", "LedgerEntryId")
export type LedgerEntryId = typeof LedgerEntryId.Type

/**
 * Who did something (`created_by`, `invited_by`, ...): a person (`usr_`) or a key (`key_`).
 * The spec types these as plain strings; we keep the two id forms so the reader can tell them apart.
 */
export const Actor = Schema.Union(UserId, KeyId).annotations({ identifier: "Actor" })
export type Actor = typeof Actor.Type

/**
 * A base's name `<distro>-<release>-<date>-<hash>`, e.g. `debian-bookworm-20250101-0123456789ab`
 * (as `host-agent/bases` makes them). Names never change; a new base has a new name.
 */
export const BaseName = Schema.String.pipe(
  Schema.pattern(/^[a-z][a-z0-9]*-[a-z0-9][a-z0-9.]*-[0-9]{8}-[0-9a-f]{6,64}$/, {
    message: () => "must be a base name <distro>-<release>-<yyyymmdd>-<hash>",
  }),
  Schema.brand("BaseName"),
).annotations({ identifier: "BaseName" })
export type BaseName = typeof BaseName.Type

/** The pattern of function and provider names: 1 to 40 of `a-z0-9-`, starting with a letter or digit. */
export const namePattern = /^[a-z0-9][a-z0-9-]{0,39}$/

/** A function's name; two functions of an account may share one (the id is the address). */
export const FunctionName = Schema.String.pipe(
  Schema.pattern(namePattern, { message: () => `must match ${namePattern.source}` }),
).annotations({ identifier: "FunctionName" })
export type FunctionName = typeof FunctionName.Type

/**
 * A provider's name. `none` is refused: in a definition, `"provider": "none"` means a function
 * without an agent (DESIGN.md), so no provider may be called that.
 */
export const ProviderName = Schema.String.pipe(
  Schema.pattern(namePattern, { message: () => `must match ${namePattern.source}` }),
  Schema.filter((s) => s !== "none" || "`none` is reserved (it means a function without an agent)"),
).annotations({ identifier: "ProviderName" })
export type ProviderName = typeof ProviderName.Type

/** The `provider` value of a function without an agent (DESIGN.md): the run waits for `finish`. */
export const noProvider = "none" as const

const providerIdRef = new RegExp(`^prv_${idBody}@(latest|[1-9][0-9]{0,8})$`)
const providerNameRef = /^[a-z0-9][a-z0-9-]{0,39}(@(latest|[1-9][0-9]{0,8}))?$/

/**
 * A provider reference as a caller writes it in a definition: `prv_<id>@<n>`, `prv_<id>@latest`,
 * `<name>`, `<name>@latest`, `<name>@<n>`, or `none` (no agent). Names are resolved at publish.
 */
export const ProviderRefInput = Schema.String.pipe(
  Schema.filter(
    (s) =>
      providerIdRef.test(s) ||
      providerNameRef.test(s) ||
      "must be prv_<id>@<n>, prv_<id>@latest, <name>, <name>@<n>, <name>@latest or none",
  ),
).annotations({ identifier: "ProviderRefInput" })
export type ProviderRefInput = typeof ProviderRefInput.Type

/** A provider reference as a version stores it: `prv_<id>@<n>`, `prv_<id>@latest`, or `none`. */
export const ProviderRef = Schema.String.pipe(
  Schema.filter(
    (s) => s === noProvider || providerIdRef.test(s) || "must be prv_<id>@<n>, prv_<id>@latest or none",
  ),
  Schema.brand("ProviderRef"),
).annotations({ identifier: "ProviderRef" })
export type ProviderRef = typeof ProviderRef.Type

/** The parts of a provider reference: a provider id or name, and a version number or `latest`. */
export interface ParsedProviderRef {
  readonly provider: string
  readonly isId: boolean
  readonly version: number | "latest"
}

/** Splits a valid reference (`none` excluded); a reference without `@` means `@latest`. */
export const parseProviderRef = (ref: string): ParsedProviderRef => {
  const at = ref.indexOf("@")
  const provider = at < 0 ? ref : ref.slice(0, at)
  const tail = at < 0 ? "latest" : ref.slice(at + 1)
  return { provider, isId: provider.startsWith("prv_"), version: tail === "latest" ? "latest" : Number(tail) }
}

/** The stored reference to a provider id at a version number or `latest`. */
export const providerRef = (provider: ProviderId, version: number | "latest"): ProviderRef =>
  `${provider}@${version}` as ProviderRef
