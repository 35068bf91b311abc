/**
 * The `hangar` command. Operators use `serve` and `admin`; the caller-facing commands of
 * the spec's CLI join here as their issues land.
 *
 *   hangar serve gateway|relay|actors|host-agent   one role, connecting to HANGAR_NATS_URL
 *   hangar serve all                               local nats-server + every role (npm start)
 *   hangar admin …                                 operator commands (cli/admin.ts)
 *   hangar version
 *
 * Exit status: 0 worked, 2 wrong command, 4 anything else (the spec's CLI statuses).
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { Effect, Layer } from "effect"
import * as Actors from "../actors/main.ts"
import * as Connected from "../core/Connected.ts"
import * as Log from "../core/Log.ts"
import { runMain } from "../core/Main.ts"
import * as Local from "../deploy/Local.ts"
import { root } from "../deploy/tools.mjs"
import * as Gateway from "../gateway/main.ts"
import * as HostAgent from "../host-agent/main.ts"
import * as Relay from "../relay/main.ts"
import * as Admin from "./admin.ts"

const roles = {
  gateway: Gateway.layer,
  relay: Relay.layer,
  actors: Actors.layer,
  "host-agent": HostAgent.layer,
} as const

const usage = `usage:
  hangar serve gateway|relay|actors|host-agent|all
  hangar admin create-account|token|credit|suspend|reactivate …
  hangar version`

const version = (): string =>
  (JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string }).version

const wrong = (message: string) => {
  process.stderr.write(`${message}\n${usage}\n`)
  process.exit(2)
}

const serve = (role: string | undefined) => {
  if (role === "all") return runMain(Layer.launch(Local.layer).pipe(Effect.provide(Log.layer)))
  if (role === undefined || !(role in roles)) return wrong(`unknown role: ${role ?? "(none)"}`)
  const layer = roles[role as keyof typeof roles].pipe(Layer.provide(Connected.layerFromEnv))
  return runMain(Layer.launch(layer).pipe(Effect.provide(Log.layer)))
}

const [command, ...rest] = process.argv.slice(2)
switch (command) {
  case "serve":
    serve(rest[0])
    break
  case "admin":
    Admin.main(rest)
    break
  case "version":
    process.stdout.write(`${version()}\n`)
    break
  default:
    wrong(command === undefined ? "no command given" : `unknown command: ${command}`)
}
