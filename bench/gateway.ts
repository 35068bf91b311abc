/**
 * Gateway overhead, each target driven in turn by autocannon from a second process on loopback
 * (its CLI, spawned with `-j`), against one real nats-server:
 *
 * - bare uWS: the same bytes as `/v1/health` from a bare route (the baseline);
 * - `GET /v1/health` through the full gateway (routing, rate limit, request id, the access log
 *   rendered as JSON and discarded; answered inside uWS's callback, `Route.now`);
 * - `GET /v1/tools` with an admin key: authenticated (token hash, key cache, account record, all
 *   from memory);
 * - bare uWS, tools bytes: `/v1/tools`'s 3 KB answer from a bare route, what the bigger body costs
 *   without the gateway (the tools row's ratio is still to the first bare row, as the issue asks);
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
 *
 * `BENCH_CPU_PROFILE=<folder>`: this process's CPU profile of each target, written there as
 * `<n>-<target>.cpuprofile` (`bench/profile-summary.ts --per=<requests>` sums it per request). The
 * profiler slows every target; read the figures of a run without it.
 */

import uWS from "uWebSockets.js"
import { spawn } from "node:child_process"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { Session } from "node:inspector/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Logger } from "effect"
import { startAccountWorker } from "../actors/account/testing.ts"
import * as Accounts from "../gateway/accounts/routes.ts"
import { personToken, run, startGateway } from "../gateway/auth/testing.ts"
import * as Health from "../gateway/Health.ts"
import * as Tools from "../gateway/tools/Tools.ts"
import { tools } from "../schema/Tools.ts"
import { startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const seconds = Number(process.argv[2] ?? 6)
const connections = Number(process.argv[3] ?? 50)
const autocannon = createRequire(import.meta.url).resolve("autocannon/autocannon.js")

const profileDir = process.env.BENCH_CPU_PROFILE
const profiling = profileDir === undefined ? undefined : new Session()
let profiled = 0

interface Figures {
  readonly rps: number
  readonly p50: number
  readonly p99: number
  readonly errors: number
  readonly non2xx: number
  /** This process's CPU time (user + system) per request, in µs, warm-up included. */
  readonly cpuUs: number
  readonly requests: number
}

// autocannon in its own process, so the load generator does not share this event loop.
const drive = async (
  name: string,
  url: string,
  headers: Record<string, string> = {},
  options: { readonly rate?: number; readonly connections?: number } = {},
): Promise<[string, Figures]> => {
  await profiling?.post("Profiler.start")
  const figures = await load(url, headers, options)
  if (profiling) {
    const { profile } = await profiling.post("Profiler.stop")
    const file = join(profileDir ?? "", `${++profiled}-${name.replace(/[^a-z0-9]+/gi, "-")}.cpuprofile`)
    await writeFile(file, JSON.stringify(profile))
    console.log(`CPU profile of ${name} (${figures.requests} requests): ${file}`)
  }
  return [name, figures]
}

const load = (
  url: string,
  headers: Record<string, string>,
  options: { readonly rate?: number; readonly connections?: number },
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
        requests: r.requests.total,
      })
    })
  })

// The baseline: the same body from a bare uWS route, with only the abort handler uWS requires; and
// `GET /v1/tools`'s 3 KB body the same way, to tell what that route's bigger answer costs alone.
const bare = (): Promise<{ port: number; close: () => void }> =>
  new Promise((resolve, reject) => {
    const body = JSON.stringify({ status: "ok" })
    const toolsBody = JSON.stringify({ tools })
    const app = uWS
      .App()
      .get("/v1/health", (res) => {
        res.cork(() => res.writeHeader("content-type", "application/json").end(body))
      })
      .get("/v1/tools", (res) => {
        res.cork(() => res.writeHeader("content-type", "application/json").end(toolsBody))
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
  if (profiling) {
    profiling.connect()
    await profiling.post("Profiler.enable")
    await profiling.post("Profiler.setSamplingInterval", { interval: 100 })
  }
  const guard = setTimeout(() => {
    process.stderr.write("bench/gateway: did not finish in time\n")
    process.exit(1)
  }, 180_000)
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
    await drive("bare uWS", `http://127.0.0.1:${baseline.port}/v1/health`),
    await drive("health", `${gateway.url}/v1/health`),
    await drive("tools, admin key", `${gateway.url}/v1/tools`, admin),
    await drive("bare uWS, tools bytes", `http://127.0.0.1:${baseline.port}/v1/tools`),
    await drive("account, person", `${gateway.url}/v1/account`, person),
    await drive("tools @1000/s", `${gateway.url}/v1/tools`, admin, { rate: 1000 }),
    // autocannon paces each connection on its own timer, so 50 connections arrive as bursts of 50;
    // 10 connections give the same 1,000 requests/s with smaller bursts.
    await drive("tools @1000/s, 10 c", `${gateway.url}/v1/tools`, admin, { rate: 1000, connections: 10 }),
    // The baseline again: how much the machine's share moved during the run (the ratios use the first).
    await drive("bare uWS, again", `http://127.0.0.1:${baseline.port}/v1/health`),
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
      `${name.padEnd(21)} ${f.rps.toFixed(0).padStart(8)} req/s   p50 ${String(f.p50).padStart(4)} ms   p99 ${String(f.p99).padStart(4)} ms   ratio ${(f.rps / base).toFixed(2)}   cpu ${f.cpuUs.toFixed(1).padStart(6)} µs/req   errors ${f.errors}   non-2xx ${f.non2xx}`,
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
