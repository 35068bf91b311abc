/**
 * Gateway overhead, each target driven in turn by autocannon from a second process on loopback
 * (its CLI, spawned with `-j`), against one real nats-server:
 *
 * - bare uWS: the same bytes as `/v1/health` from a bare route (the baseline);
 * - `GET /v1/health` through the full gateway (routing, rate limit, request id, the access log
 *   rendered as JSON and discarded; answered inside uWS's callback, `Route.now`);
 * - `GET /v1/tools` with an admin key: authenticated (token hash, key cache, account record, all
 *   from memory);
 * - `GET /v1/account` with the owner's ID token and `Service-Account`: a person (verified token,
 *   person, membership, account and the account actor's balance and webhook key, from the watched
 *   caches). The spec gives this route to people only, so an admin key gets `people_only`;
 * - `GET /v1/tools` with the admin key paced at 1,000 requests/s, for p99 under a steady load
 *   (over 50 and over 10 connections: autocannon paces each connection alone, so many connections
 *   arrive as bursts).
 *
 * It prints requests/s, p50/p99, each target's ratio to the bare route, and the CPU time this
 * process (the gateway, or the bare route) spent per request: on a shared machine the ratios move
 * with whatever else runs, the CPU per request much less. Both sides share the machine's two cores
 * with the load generator; read the ratios. Stops by itself in about a minute.
 *
 *   node --import tsx bench/gateway.ts [seconds per target, default 6] [connections, default 50]
 */

import uWS from "uWebSockets.js"
import { spawn } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Logger } from "effect"
import { startAccountWorker } from "../actors/account/testing.ts"
import * as Accounts from "../gateway/accounts/routes.ts"
import { personToken, run, startGateway } from "../gateway/auth/testing.ts"
import * as Health from "../gateway/Health.ts"
import * as Tools from "../gateway/tools/Tools.ts"
import { startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const seconds = Number(process.argv[2] ?? 6)
const connections = Number(process.argv[3] ?? 50)
const autocannon = createRequire(import.meta.url).resolve("autocannon/autocannon.js")

interface Figures {
  readonly rps: number
  readonly p50: number
  readonly p99: number
  readonly errors: number
  readonly non2xx: number
  /** This process's CPU time (user + system) per request, in µs, warm-up included. */
  readonly cpuUs: number
}

// autocannon in its own process, so the load generator does not share this event loop.
const drive = (
  url: string,
  headers: Record<string, string> = {},
  options: { readonly rate?: number; readonly connections?: number } = {},
): Promise<Figures> =>
  new Promise((resolve, reject) => {
    const cpu = process.cpuUsage()
    const args = [
      "-j",
      "-c",
      String(options.connections ?? connections),
      "-d",
      String(seconds),
      "-W",
      "[-c 10 -d 1]",
    ]
    for (const [name, value] of Object.entries(headers)) args.push("-H", `${name}=${value}`)
    if (options.rate !== undefined) args.push("-R", String(options.rate))
    const child = spawn(process.execPath, [autocannon, ...args, url], {
      stdio: ["ignore", "pipe", "inherit"],
    })
    let out = ""
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString()
    })
    child.on("error", reject)
    child.on("exit", (code) => {
      if (code !== 0) return reject(new Error(`autocannon exited with ${code}`))
      // With a warm-up, autocannon prints the warm-up's result first; the last line is the run.
      const r = JSON.parse(out.trim().split("\n").at(-1)!)
      const used = process.cpuUsage(cpu)
      resolve({
        rps: r.requests.average,
        p50: r.latency.p50,
        p99: r.latency.p99,
        errors: r.errors + r.timeouts,
        non2xx: r.non2xx,
        cpuUs: (used.user + used.system) / Math.max(1, r.requests.total),
      })
    })
  })

// The baseline: the same body from a bare uWS route, with only the abort handler uWS requires.
const bare = (): Promise<{ port: number; close: () => void }> =>
  new Promise((resolve, reject) => {
    const body = JSON.stringify({ status: "ok" })
    const app = uWS.App().get("/v1/health", (res) => {
      res.cork(() => res.writeHeader("content-type", "application/json").end(body))
    })
    app.listen("127.0.0.1", 0, (socket) => {
      if (!socket) return reject(new Error("bare uWS could not listen"))
      resolve({
        port: uWS.us_socket_local_port(socket as unknown as uWS.us_socket),
        close: () => uWS.us_listen_socket_close(socket),
      })
    })
  })

const main = async () => {
  const guard = setTimeout(() => {
    process.stderr.write("bench/gateway: did not finish in time\n")
    process.exit(1)
  }, 150_000)
  const nats = await startNatsServer()
  const dir = await mkdtemp(join(tmpdir(), "hangar-bench-gateway-"))
  const keyFile = join(dir, "issuer.key")
  const prefix = uniquePrefix()
  const gateway = await startGateway([...Health.routes, ...Accounts.routes, ...Tools.routes], {
    natsUrl: nats.url,
    prefix,
    keyFile,
    discardLogs: true,
  })
  // The account actor answers `GET /v1/account`'s first question for the webhook key.
  const worker = await Effect.runPromise(
    startAccountWorker(nats.url, prefix).pipe(
      Effect.provide(Logger.replace(Logger.defaultLogger, Logger.none)),
    ),
  )
  // An account, its owner's ID token, and an admin key made through the API as a caller would.
  const owner = "owner@bench.example"
  const { account } = await run(gateway.accounts.createAccount("bench", owner))
  const person = {
    authorization: `Bearer ${await personToken(keyFile, owner)}`,
    "service-account": account.id,
  }
  const created = await fetch(`${gateway.url}/v1/keys`, {
    method: "POST",
    headers: { ...person, "content-type": "application/json" },
    body: JSON.stringify({ name: "bench", scope: "admin" }),
  })
  if (created.status !== 201) throw new Error(`creating the admin key answered ${created.status}`)
  const admin = { authorization: `Bearer ${((await created.json()) as { token: string }).token}` }
  const baseline = await bare()

  const rows: Array<[string, Figures]> = [
    ["bare uWS", await drive(`http://127.0.0.1:${baseline.port}/v1/health`)],
    ["health", await drive(`${gateway.url}/v1/health`)],
    ["tools, admin key", await drive(`${gateway.url}/v1/tools`, admin)],
    ["account, person", await drive(`${gateway.url}/v1/account`, person)],
    ["tools @1000/s", await drive(`${gateway.url}/v1/tools`, admin, { rate: 1000 })],
    // autocannon paces each connection on its own timer, so 50 connections arrive as bursts of 50;
    // 10 connections give the same 1,000 requests/s with smaller bursts.
    ["tools @1000/s, 10 c", await drive(`${gateway.url}/v1/tools`, admin, { rate: 1000, connections: 10 })],
    // The baseline again: how much the machine's share moved during the run (the ratios use the first).
    ["bare uWS, again", await drive(`http://127.0.0.1:${baseline.port}/v1/health`)],
  ]
  baseline.close()
  await Effect.runPromise(worker.stop)
  await gateway.close()
  await nats.stop()
  await rm(dir, { recursive: true, force: true })
  clearTimeout(guard)

  const base = rows[0]![1].rps
  console.log(`${connections} connections, ${seconds} s each, autocannon in a child process`)
  for (const [name, f] of rows) {
    console.log(
      `${name.padEnd(18)} ${f.rps.toFixed(0).padStart(8)} req/s   p50 ${String(f.p50).padStart(4)} ms   p99 ${String(f.p99).padStart(4)} ms   ratio ${(f.rps / base).toFixed(2)}   cpu ${f.cpuUs.toFixed(1).padStart(6)} µs/req   errors ${f.errors}   non-2xx ${f.non2xx}`,
    )
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${e}\n`)
    process.exit(1)
  },
)
