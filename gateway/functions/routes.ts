/**
 * `GET /v1/functions`, `POST /v1/functions`, `GET /v1/functions/{id}`,
 * `POST /v1/functions/{id}/versions`. Publishing decodes the Definition with every rule of the
 * schema, fills the remaining defaults (`Definitions.ts`), and stores an immutable version. Reads
 * by a run key reach only the functions its `functions` list names (spec "Authentication" 4).
 */
import { Clock, Effect, Option } from "effect"
import type { AccountRecord } from "../../core/Accounts.ts"
import { Functions } from "../../core/Functions.ts"
import { timestamp } from "../../schema/Common.ts"
import {
  CreateFunctionRequest,
  type Definition,
  type DefinitionInput,
  PublishVersionRequest,
} from "../../schema/Definition.ts"
import { ApiError } from "../../schema/Errors.ts"
import {
  FunctionDetail,
  FunctionList,
  type Version,
  Version as VersionSchema,
} from "../../schema/Function.ts"
import type { Actor, FunctionId } from "../../schema/Ids.ts"
import { type AccountKey, type AccountPerson, actorOf } from "../auth/Access.ts"
import { authRoute } from "../auth/Route.ts"
import { newId } from "../Idempotency.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"
import { lastRuns, linkBase } from "../runs/Runs.ts"
import { definitionBodyLimit, orInternal, resolveDefinition } from "./Definitions.ts"

type Member = AccountPerson | AccountKey

// A run key reads only the functions it may start; `*` is every function.
const mayRead = (principal: Member, id: string): boolean =>
  principal._tag !== "AccountKey" ||
  principal.key.scope === "admin" ||
  principal.key.functions.some((f) => f === "*" || f === id)

const definitionOf = (
  body: CreateFunctionRequest | PublishVersionRequest,
): { readonly input: DefinitionInput; readonly externalReference: string | undefined } => {
  const { external_reference, ...rest } = body
  const { name: _, ...input } = rest as DefinitionInput & { name?: string }
  return { input, externalReference: external_reference }
}

const versionOf = (
  id: FunctionId,
  n: number,
  definition: Definition,
  externalReference: string | undefined,
  at: number,
  by: Actor,
): Version => ({
  ...definition,
  function: id,
  version: n,
  ...(externalReference === undefined ? {} : { external_reference: externalReference }),
  created_at: timestamp(at),
  created_by: by,
})

const publishIn = (account: AccountRecord) => (input: DefinitionInput) => resolveDefinition(account, input)

/** The function routes. */
export const routes = [
  documented(
    authRoute({
      method: "GET",
      path: "/v1/functions",
      access: "member",
      handler: ({ principal, headers }) =>
        Effect.gen(function* () {
          const functions = yield* Functions
          const all = yield* orInternal(functions.list(principal.account.id))
          const visible = all.filter((f) => mayRead(principal, f.function.id))
          const last = yield* orInternal(
            lastRuns(
              principal.account.id,
              visible.map((f) => f.function.id),
              yield* linkBase(headers),
            ),
          )
          const items = visible.map((f) => {
            const run = last.get(f.function.id)
            return { ...f.function, definition: f.definition, ...(run === undefined ? {} : { last: run }) }
          })
          return json({ functions: items })
        }),
    }),
    {
      summary: "The account's functions with their latest version and last run.",
      response: { status: 200, schema: FunctionList },
    },
  ),
  documented(
    authRoute({
      method: "POST",
      path: "/v1/functions",
      access: "member (admin keys)",
      body: CreateFunctionRequest,
      bodyLimit: definitionBodyLimit,
      handler: ({ principal, body }) =>
        Effect.gen(function* () {
          const functions = yield* Functions
          const { input, externalReference } = definitionOf(body)
          const definition = yield* publishIn(principal.account)(input)
          const id = (yield* newId("fnc")) as FunctionId
          const version = versionOf(
            id,
            1,
            definition,
            externalReference,
            yield* Clock.currentTimeMillis,
            actorOf(principal) as Actor,
          )
          yield* orInternal(functions.create(principal.account.id, version, body.name))
          return json(version, { status: 201 })
        }),
    }),
    {
      summary: "Create a function with its version 1.",
      body: CreateFunctionRequest,
      response: { status: 201, schema: VersionSchema },
    },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/functions/:id",
      access: "member",
      handler: ({ principal, params }) =>
        Effect.gen(function* () {
          const functions = yield* Functions
          if (!mayRead(principal, params.id)) return yield* Effect.fail(ApiError.keyScope())
          const found = yield* orInternal(functions.get(principal.account.id, params.id))
          if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("function"))
          const versions = yield* orInternal(functions.versions(params.id))
          return json({ function: found.value, versions })
        }),
    }),
    {
      summary: "A function and its versions, oldest first.",
      response: { status: 200, schema: FunctionDetail },
    },
  ),
  documented(
    authRoute({
      method: "POST",
      path: "/v1/functions/:id/versions",
      access: "member (admin keys)",
      body: PublishVersionRequest,
      bodyLimit: definitionBodyLimit,
      handler: ({ principal, params, body }) =>
        Effect.gen(function* () {
          const functions = yield* Functions
          const account = principal.account
          // Checked before anything is sealed, so a publish to a missing function stores nothing.
          const found = yield* orInternal(functions.get(account.id, params.id))
          if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("function"))
          const id = found.value.id
          const { input, externalReference } = definitionOf(body)
          const definition = yield* publishIn(account)(input)
          const at = yield* Clock.currentTimeMillis
          const by = actorOf(principal) as Actor
          const version = yield* orInternal(
            functions.publish(account.id, id, (n) => versionOf(id, n, definition, externalReference, at, by)),
          )
          return json(version, { status: 201 })
        }),
    }),
    {
      summary: "Publish the next version of a function.",
      body: PublishVersionRequest,
      response: { status: 201, schema: VersionSchema },
    },
  ),
]
