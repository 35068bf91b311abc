/**
 * `GET /v1/providers`, `POST /v1/providers`, `POST /v1/providers/{id}/versions`. A publish checks
 * the key against the vendor's catalog (`Vendors.checkKey`: the key works and the model is in the
 * catalog), then the effort and output limit against the model's entry, and only then seals the
 * key into `Secrets`; the key is never returned, logged or put in an error.
 */
import { Clock, Effect, Option, Redacted } from "effect"
import { Providers, type ProviderVersion } from "../../core/Providers.ts"
import { Secrets } from "../../core/Secrets.ts"
import { toApiError } from "../../core/vendors/Errors.ts"
import { Vendors } from "../../core/vendors/Vendors.ts"
import { timestamp } from "../../schema/Common.ts"
import { ApiError } from "../../schema/Errors.ts"
import type { AccountId, Actor, ProviderId, SecretId } from "../../schema/Ids.ts"
import {
  CreateProviderRequest,
  type Model,
  type ModelInput,
  Provider,
  ProviderList,
  ProviderVersionRequest,
} from "../../schema/Provider.ts"
import { actorOf } from "../auth/Access.ts"
import { authRoute } from "../auth/Route.ts"
import { orInternal } from "../functions/Definitions.ts"
import { newId } from "../Idempotency.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"

/** Provider bodies are small; 64 KiB is far above any sensible one. */
export const providerBodyLimit = 64 * 1024

/**
 * Checks the key and model with the vendor and seals the key; answers the model as stored and the
 * key's secret id. Vendor refusals are `400` naming `key` or `model.*`; a vendor down is `502`.
 */
export const checkAndSeal = (account: AccountId, model: ModelInput, key: Redacted.Redacted<string>) =>
  Effect.gen(function* () {
    const vendors = yield* Vendors
    const secrets = yield* Secrets
    const entry = yield* vendors.checkKey(model.provider, key, model.model).pipe(Effect.mapError(toApiError))
    if (model.reasoning_effort !== "" && !entry.efforts.includes(model.reasoning_effort))
      return yield* Effect.fail(
        ApiError.invalidRequest(
          `model.reasoning_effort: ${model.model} takes ${entry.efforts.length === 0 ? "no effort (send an empty string)" : `one of ${entry.efforts.join(", ")} or an empty string`}`,
        ),
      )
    if (model.max_output_tokens > entry.max_output_tokens)
      return yield* Effect.fail(
        ApiError.invalidRequest(
          `model.max_output_tokens: ${model.model} replies with at most ${entry.max_output_tokens} tokens (0 uses that maximum)`,
        ),
      )
    const stored: Model = {
      provider: model.provider,
      model: model.model,
      reasoning_effort: model.reasoning_effort,
      compact_at_tokens: model.compact_at_tokens,
      max_output_tokens: model.max_output_tokens,
    }
    const keySecret: SecretId = yield* orInternal(
      secrets.store(account, { kind: "vendor", vendor: model.provider }, key),
    )
    return { model: stored, keySecret }
  })

const providerOf = (
  id: ProviderId,
  n: number,
  name: string,
  model: Model,
  externalReference: string | undefined,
  at: number,
  by: Actor,
): Provider => ({
  id,
  version: n,
  name,
  model,
  ...(externalReference === undefined ? {} : { external_reference: externalReference }),
  created_at: timestamp(at),
  created_by: by,
})

/** The provider routes. */
export const routes = [
  documented(
    authRoute({
      method: "GET",
      path: "/v1/providers",
      access: "member (admin keys)",
      handler: ({ principal }) =>
        Effect.gen(function* () {
          const providers = yield* Providers
          return json({ providers: yield* orInternal(providers.list(principal.account.id)) })
        }),
    }),
    {
      summary: "The account's providers, newest first, each with its versions newest first.",
      response: { status: 200, schema: ProviderList },
    },
  ),
  documented(
    authRoute({
      method: "POST",
      path: "/v1/providers",
      access: "member (admin keys)",
      body: CreateProviderRequest,
      bodyLimit: providerBodyLimit,
      handler: ({ principal, body }) =>
        Effect.gen(function* () {
          const providers = yield* Providers
          const account = principal.account.id
          const { model, keySecret } = yield* checkAndSeal(account, body.model, Redacted.make(body.key))
          const provider = providerOf(
            (yield* newId("prv")) as ProviderId,
            1,
            body.name,
            model,
            body.external_reference,
            yield* Clock.currentTimeMillis,
            actorOf(principal) as Actor,
          )
          yield* orInternal(providers.create({ account, provider, key_secret: keySecret }))
          return json(provider, { status: 201 })
        }),
    }),
    {
      summary: "Create a provider; the key is checked with the vendor and never returned.",
      body: CreateProviderRequest,
      response: { status: 201, schema: Provider },
    },
  ),
  documented(
    authRoute({
      method: "POST",
      path: "/v1/providers/:id/versions",
      access: "member (admin keys)",
      body: ProviderVersionRequest,
      bodyLimit: providerBodyLimit,
      handler: ({ principal, params, body }) =>
        Effect.gen(function* () {
          const providers = yield* Providers
          const account = principal.account.id
          // Checked first, so a version of a missing provider never reaches the vendor or the store.
          const head = yield* orInternal(providers.head(account, params.id))
          if (Option.isNone(head)) return yield* Effect.fail(ApiError.notFound("provider"))
          const { id, name } = head.value
          const { model, keySecret } = yield* checkAndSeal(account, body.model, Redacted.make(body.key))
          const at = yield* Clock.currentTimeMillis
          const by = actorOf(principal) as Actor
          const provider = yield* orInternal(
            providers.publish(
              account,
              id,
              (n): ProviderVersion => ({
                account,
                provider: providerOf(id, n, name, model, body.external_reference, at, by),
                key_secret: keySecret,
              }),
            ),
          )
          return json(provider, { status: 201 })
        }),
    }),
    {
      summary: "Publish a provider's next version (a new key or setting).",
      body: ProviderVersionRequest,
      response: { status: 201, schema: Provider },
    },
  ),
]
