/**
 * A gateway serving the uploads routes in a process of its own, for the heavy test and the bench
 * (so its memory and CPU are its own): `node --import tsx gateway/uploads/testServer.ts '<json>'`
 * with `{natsUrl, prefix, dir}`. It makes an account with an admin key, prints one JSON line
 * `{url, account, token}` on stdout, logs JSON on stderr, and runs until SIGTERM or SIGINT, or
 * until its stdin ends: the parent holds it open, so a parent that dies without stopping it (a
 * bench whose output pipe closed, a killed test) does not leave it running.
 */
import { Effect } from "effect"
import { Accounts } from "../../core/Accounts.ts"
import * as Log from "../../core/Log.ts"
import { runMain } from "../../core/Main.ts"
import { Server } from "../Server.ts"
import { accountWithKey, gatewayLayer } from "./testing.ts"

const options = JSON.parse(process.argv[2] ?? "{}") as {
  readonly natsUrl: string
  readonly prefix: string
  readonly dir: string
}

process.stdin.resume()
process.stdin.once("end", () => process.kill(process.pid, "SIGTERM"))

const program = Effect.gen(function* () {
  const server = yield* Server
  const accounts = yield* Accounts
  const made = yield* Effect.promise(() => accountWithKey(accounts, "heavy"))
  process.stdout.write(`${JSON.stringify({ url: server.url, ...made })}\n`)
  return yield* Effect.never
})

runMain(program.pipe(Effect.provide(gatewayLayer(options)), Effect.provide(Log.layer), Effect.scoped))
