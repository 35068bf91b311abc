/**
 * `GET /v1/tools`: the tools shown to the model, for callers who run their own agent loop
 * (spec "Tools listing"; envelope `{tools: [{name, description, input_schema}]}`, DESIGN.md). The
 * list itself is `schema/Tools.ts`'s, which Hangar's own agent loop shows its models too.
 */
import { Effect } from "effect"
import { ToolList, tools } from "../../schema/Tools.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"

// The same for every caller: serialized once.
const listing = json({ tools })

export { tools }

/** `GET /v1/tools`. */
export const routes = [
  documented(
    authRoute({
      method: "GET",
      path: "/v1/tools",
      access: "member",
      handler: () => Effect.succeed(listing),
      now: () => listing,
    }),
    {
      summary: "The tools shown to the model, for callers' own agent loops.",
      response: { status: 200, schema: ToolList },
    },
  ),
]
