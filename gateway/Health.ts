/**
 * `GET /v1/health`: whether this gateway can serve: `200 {"status":"ok"}`, or `503
 * {"status":"unavailable"}` with `Retry-After` while its NATS connection is down (a load balancer
 * then sends requests to another gateway). It never waits on NATS itself, and is never rate
 * limited (`Route.unlimited`): a load balancer's probe is not refused for others' traffic.
 */
import { Context, Effect, Option } from "effect"
import { Nats } from "../core/Nats.ts"
import { json } from "./Response.ts"
import { route } from "./Router.ts"
import { UNREACHABLE_RETRY_AFTER_S } from "./Server.ts"

const ok = json({ status: "ok" })
const unavailable = json(
  { status: "unavailable" },
  { status: 503, headers: { "retry-after": String(UNREACHABLE_RETRY_AFTER_S) } },
)

const answer = (nats: Option.Option<Context.Tag.Service<Nats>>) =>
  Option.isSome(nats) && !nats.value.reachable() ? unavailable : ok

/** The health route group. */
export const routes = [
  route({
    method: "GET",
    path: "/v1/health",
    storeless: true,
    unlimited: true,
    handler: () => Effect.map(Effect.serviceOption(Nats), answer),
    now: (_, services) => answer(Context.getOption(services, Nats)),
  }),
]
