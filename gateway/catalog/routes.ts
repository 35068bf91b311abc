/**
 * `POST /v1/catalog`: the models a vendor key may use, read from the vendor each time. The key is
 * used for that one request and kept nowhere (not stored, not logged, not in an error).
 */
import { Effect, Redacted } from "effect"
import { toApiError } from "../../core/vendors/Errors.ts"
import { Vendors } from "../../core/vendors/Vendors.ts"
import { CatalogRequest, CatalogResponse } from "../../schema/Provider.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"

/** The catalog route. */
export const routes = [
  documented(
    authRoute({
      method: "POST",
      path: "/v1/catalog",
      access: "member (admin keys)",
      body: CatalogRequest,
      bodyLimit: 64 * 1024,
      handler: ({ body }) =>
        Effect.flatMap(Vendors, (v) => v.listModels(body.provider, Redacted.make(body.key))).pipe(
          Effect.mapError(toApiError),
          Effect.map((models) => json({ models })),
        ),
    }),
    {
      summary: "The models a vendor key may use; the key is used once and kept nowhere.",
      body: CatalogRequest,
      response: { status: 200, schema: CatalogResponse },
    },
  ),
]
