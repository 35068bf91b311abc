/**
 * Turning a Definition as published into the Definition a version stores: the defaults the schema
 * cannot fill (`base`: the newest base; `provider`: the account's only provider), provider names
 * resolved to ids, the account's size limits applied, and every secret sealed into `Secrets` and
 * replaced by its `secret_id`.
 *
 * Every check runs before anything is written, so a refused publish stores no secret. A reused
 * `secret_id` must be the account's, of the same kind: an environment secret for a variable, and
 * for a custom tool a secret stored for a tool at the same URL (spec "Secrets" 3) — a tool's or a
 * vendor key's secret can never become an environment variable inside the machine.
 */
import { Effect, Option, Redacted } from "effect"
import type { AccountRecord } from "../../core/Accounts.ts"
import { Providers } from "../../core/Providers.ts"
import { Secrets } from "../../core/Secrets.ts"
import type { CustomTool, Definition, DefinitionInput, EnvVar } from "../../schema/Definition.ts"
import { ApiError } from "../../schema/Errors.ts"
import { newestFirst } from "../../schema/Host.ts"
import type { SecretId } from "../../schema/Ids.ts"
import { BaseListing } from "../bases/Bases.ts"

/**
 * The largest body of a publish: every field of a Definition at its limit is about 7 MB of JSON;
 * twice that leaves room for escaping.
 */
export const definitionBodyLimit = 16 * 1024 * 1024

/** Store failures leave as a logged, detail-free `500 internal`; `ApiError`s pass unchanged. */
export const orInternal = <A, E, R>(fx: Effect.Effect<A, E, R>): Effect.Effect<A, ApiError, R> =>
  Effect.catchAll(fx, (e) =>
    e instanceof ApiError
      ? Effect.fail(e)
      : Effect.zipRight(
          // Only the tag: a store error never holds a secret, but keep the line short and certain.
          Effect.logError("store failed").pipe(
            Effect.annotateLogs({ error: (e as { _tag?: string })._tag ?? "unknown" }),
          ),
          Effect.fail(ApiError.internal()),
        ),
  )

const invalid = (field: string, message: string) => ApiError.invalidRequest(`${field}: ${message}`)

/** The stored Definition for `input`, published in `account`; seals the new secrets last. */
export const resolveDefinition = (account: AccountRecord, input: DefinitionInput) =>
  Effect.gen(function* () {
    const bases = yield* BaseListing
    const providers = yield* Providers
    const secrets = yield* Secrets

    if (!account.limits.sizes.includes(input.size))
      return yield* Effect.fail(
        invalid(
          "size",
          `this account may not use size ${input.size} (it may use ${account.limits.sizes.join(", ")})`,
        ),
      )

    // A base a live host is still building counts too: the function's runs wait in the queue
    // until it is built (the first start of a host builds its bases in the background).
    const known = [...(yield* bases.list).map((b) => b.name), ...(yield* bases.building)].sort(newestFirst)
    let base = input.base
    if (base === undefined) {
      const newest = known[0]
      if (newest === undefined)
        return yield* Effect.fail(invalid("base", "is required: no base is available yet"))
      base = newest
    } else if (!known.includes(base)) {
      return yield* Effect.fail(invalid("base", "is not one of the bases of GET /v1/bases"))
    }

    const provider = yield* orInternal(
      input.provider === undefined
        ? providers.only(account.id)
        : providers.resolve(account.id, input.provider),
    )

    // Check every reused secret first.
    for (const [i, v] of input.environment.entries()) {
      if (v.secret_id === undefined) continue
      const found = yield* orInternal(secrets.info(account.id, v.secret_id))
      if (Option.isNone(found) || found.value.binding.kind !== "env")
        return yield* Effect.fail(
          invalid(`environment[${i}].secret_id`, "no environment secret with this id in this account"),
        )
    }
    for (const [i, t] of input.custom_tools.entries()) {
      if (t.secret_id === undefined) continue
      const found = yield* orInternal(secrets.info(account.id, t.secret_id))
      if (Option.isNone(found) || found.value.binding.kind !== "tool")
        return yield* Effect.fail(
          invalid(`custom_tools[${i}].secret_id`, "no tool secret with this id in this account"),
        )
      if (found.value.binding.url !== t.url)
        return yield* Effect.fail(
          invalid(`custom_tools[${i}].secret_id`, "this secret was stored for a tool at another URL"),
        )
    }

    // Then seal the new ones.
    const environment: Array<EnvVar> = []
    for (const v of input.environment) {
      if (v.value !== undefined) environment.push({ name: v.name, value: v.value })
      else if (v.secret_id !== undefined) environment.push({ name: v.name, secret_id: v.secret_id })
      else {
        const id: SecretId = yield* orInternal(
          secrets.store(account.id, { kind: "env" }, Redacted.make(v.secret ?? "")),
        )
        environment.push({ name: v.name, secret_id: id })
      }
    }
    const customTools: Array<CustomTool> = []
    for (const t of input.custom_tools) {
      const secretId: SecretId =
        t.secret_id ??
        (yield* orInternal(
          secrets.store(account.id, { kind: "tool", url: t.url }, Redacted.make(t.secret ?? "")),
        ))
      customTools.push({
        name: t.name,
        description: t.description,
        parameters: t.parameters,
        url: t.url,
        secret_id: secretId,
        timeout_seconds: t.timeout_seconds,
      })
    }

    const definition: Definition = {
      base,
      setup: input.setup,
      provider,
      system_prompt: input.system_prompt,
      tools: input.tools,
      custom_tools: customTools,
      input_manifest: input.input_manifest,
      output_manifest: input.output_manifest,
      environment,
      size: input.size,
      timeout_minutes: input.timeout_minutes,
    }
    return definition
  })
