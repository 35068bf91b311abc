/**
 * `GET /v1/webhooks/public-key`: the account's webhook signing keys (`whpk_…`), for receivers to
 * verify signatures with. One key per account today; a list so a rotation can show two.
 */
import { Effect } from "effect"
import * as Client from "../../core/actors/AccountClient.ts"
import { ApiError } from "../../schema/Errors.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"

/** The webhook key route. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/webhooks/public-key",
    access: "member",
    handler: ({ principal }) =>
      Client.webhookKey(principal.account.id).pipe(
        // The key is made by the account actor on first use; without it there is nothing to show yet.
        Effect.catchTag("AskTimeout", () =>
          Effect.fail(ApiError.internal("the webhook key is not ready; retry")),
        ),
        Effect.map((key) => json({ keys: [key] })),
      ),
  }),
]
