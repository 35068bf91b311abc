/**
 * The OpenAPI 3.1 document of the routes served (`GET /v1/openapi.json`), generated from the route
 * table: paths and methods from the patterns, request bodies and responses from each route's
 * schemas through `JSONSchema` (one shared `components.schemas`, named by the schemas'
 * `identifier` annotations), and each route's access label as `x-access`. Nothing is written by
 * hand, so the document cannot drift from what the routes decode.
 *
 * Routes made with `authRoute` decode their body after auth, so the server-side route holds only
 * `Schema.Unknown`; a route group names its real schemas with `documented`.
 */
import { Effect, JSONSchema, Option, type Schema } from "effect"
import * as AST from "effect/SchemaAST"
import { ErrorBody } from "../../schema/Errors.ts"
import type { Access } from "../auth/Access.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"
import type { Route } from "../Router.ts"

/** What the document says about one route beyond its pattern. */
export interface RouteDoc {
  readonly summary: string
  /** The query parameters the handler decodes: a struct of optional fields. */
  // biome-ignore lint/suspicious/noExplicitAny: any schema without requirements
  readonly query?: Schema.Schema<any, any, never> & { readonly fields: Schema.Struct.Fields }
  /** The request body's schema (as decoded by the handler). */
  // biome-ignore lint/suspicious/noExplicitAny: any schema without requirements
  readonly body?: Schema.Schema<any, any, never>
  /** The success status and body schema. */
  readonly response?: {
    readonly status: number
    // biome-ignore lint/suspicious/noExplicitAny: any schema without requirements
    readonly schema: Schema.Schema<any, any, never>
  }
}

/** A route as the document reads it: possibly an access label and a `RouteDoc`. */
// biome-ignore lint/suspicious/noExplicitAny: route groups differ in requirements
export type DocumentedRoute = Route<any> & { readonly access?: Access; readonly doc?: RouteDoc }

/** Attaches documentation to a route (the route itself is unchanged). */
export const documented = <T extends object>(route: T, doc: RouteDoc): T & { readonly doc: RouteDoc } => ({
  ...route,
  doc,
})

const toOpenApiPath = (path: string) => path.replace(/:(\w+)/g, "{$1}")
const paramsOf = (path: string) => [...path.matchAll(/:(\w+)/g)].map((m) => m[1]!)

const isUnknown = (ast: AST.AST) => ast._tag === "UnknownKeyword"

/** The OpenAPI 3.1 document of `routes`. */
export const document = (
  routes: ReadonlyArray<DocumentedRoute>,
  info: { readonly title: string; readonly version: string } = { title: "Hangar", version: "1" },
) => {
  const definitions: Record<string, JSONSchema.JsonSchema7> = {}
  const schemaOf = (schema: Schema.Schema.Any) =>
    JSONSchema.fromAST(schema.ast, {
      definitions,
      definitionPath: "#/components/schemas/",
      target: "openApi3.1",
    })
  const errorSchema = schemaOf(ErrorBody)
  const paths: Record<string, Record<string, unknown>> = {}
  for (const r of routes) {
    const doc = r.doc
    const bodySchema = doc?.body ?? (r.body && !isUnknown(r.body.ast) ? r.body : undefined)
    const operation: Record<string, unknown> = {
      operationId: `${r.method.toLowerCase()}${toOpenApiPath(r.path).replace(/[^A-Za-z0-9]+(.)?/g, (_, c: string | undefined) => (c ?? "").toUpperCase())}`,
      ...(doc ? { summary: doc.summary } : {}),
      ...(r.access ? { "x-access": r.access } : {}),
      ...(r.access && r.access !== "anyone" ? { security: [{ bearer: [] }] } : { security: [] }),
      parameters: [
        ...paramsOf(r.path).map((name) => ({ name, in: "path", required: true, schema: { type: "string" } })),
        ...Object.entries(doc?.query?.fields ?? {}).map(([name, field]) => {
          // Said on the field (`optional(…).annotations`), else on its schema.
          const ast = (field as { readonly ast: AST.Annotated & { readonly type?: AST.AST } }).ast
          const described = Option.orElse(AST.getDescriptionAnnotation(ast), () =>
            ast.type === undefined ? Option.none() : AST.getDescriptionAnnotation(ast.type),
          )
          return {
            name,
            in: "query",
            required: false,
            ...(Option.isSome(described) ? { description: described.value } : {}),
            schema: { type: "string" },
          }
        }),
        ...(r.access && r.access !== "anyone" && r.access !== "signed in"
          ? [
              {
                name: "Service-Account",
                in: "header",
                required: false,
                description: "The account id; required with a person's token, not with a key.",
                schema: { type: "string" },
              },
            ]
          : []),
      ],
      ...(r.stream
        ? { requestBody: { required: true, content: { "application/octet-stream": { schema: {} } } } }
        : bodySchema
          ? {
              requestBody: {
                required: true,
                content: { "application/json": { schema: schemaOf(bodySchema) } },
              },
            }
          : {}),
      responses: {
        [String(doc?.response?.status ?? 200)]: {
          description: "success",
          ...(doc?.response
            ? { content: { "application/json": { schema: schemaOf(doc.response.schema) } } }
            : {}),
        },
        default: {
          description: "an error: `code` decides the status (spec Errors)",
          content: { "application/json": { schema: errorSchema } },
        },
      },
    }
    const path = toOpenApiPath(r.path)
    paths[path] = { ...paths[path], [r.method.toLowerCase()]: operation }
  }
  return {
    openapi: "3.1.0",
    info,
    paths,
    components: {
      schemas: definitions,
      securitySchemes: {
        bearer: {
          type: "http",
          scheme: "bearer",
          description: "An account key (`hgr_…`) or a person's ID token (then send `Service-Account`).",
        },
      },
    },
  }
}

/** `GET /v1/openapi.json` describing `routes` and itself; the document is built once. */
export const routesFor = (routes: ReadonlyArray<DocumentedRoute>) => {
  const self = documented(
    authRoute({
      method: "GET",
      path: "/v1/openapi.json",
      access: "anyone",
      handler: () => Effect.sync(() => reply()),
    }),
    { summary: "This document." },
  )
  let cached: ReturnType<typeof json> | undefined
  const reply = () => {
    cached ??= json(document([...routes, self]))
    return cached
  }
  return [self]
}
