/**
 * `GET /v1/health`: whether this gateway can serve. For now it answers as soon as the server
 * runs; it will also check the NATS connection once the gateway has one.
 */
import { Effect } from "effect"
import { json } from "./Response.ts"
import { route } from "./Router.ts"

const ok = json({ status: "ok" })

/** The health route group. */
export const routes = [
  route({
    method: "GET",
    path: "/v1/health",
    handler: () => Effect.succeed(ok),
  }),
]
