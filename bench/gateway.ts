/**
 * Gateway overhead: `GET /v1/health` through the full gateway (routing, rate limit, request id,
 * Effect fiber per request, access log rendered as JSON) against a bare uWS route answering the
 * same bytes, both in this process. autocannon drives each in turn from a second process on
 * loopback (its CLI, spawned with `-j`), and the script prints requests/s, p50/p99 latency and the
 * gateway/bare ratio. Both share the machine's cores with the load generator, so read the ratio
 * rather than the absolute figures. Stops by itself in about 25 s with the defaults.
 *
 *   node --import tsx bench/gateway.ts [seconds per target, default 6] [connections, default 50]
 */

import uWS from "uWebSockets.js"
import { spawn } from "node:child_process"
import { createRequire } from "node:module"
import { Context, Effect, Exit, Layer, Logger, Scope } from "effect"
import { jsonLogger } from "../core/Log.ts"
import * as Health from "../gateway/Health.ts"
import * as RateLimit from "../gateway/RateLimit.ts"
import * as Server from "../gateway/Server.ts"

const seconds = Number(process.argv[2] ?? 6)
const connections = Number(process.argv[3] ?? 50)
const autocannon = createRequire(import.meta.url).resolve("autocannon/autocannon.js")

interface Figures {
  readonly rps: number
  readonly p50: number
  readonly p99: number
  readonly errors: number
  readonly non2xx: number
}

// autocannon in its own process, so the load generator does not share this event loop.
const drive = (url: string): Promise<Figures> =>
  new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [autocannon, "-j", "-c", String(connections), "-d", String(seconds), "-W", "[-c 10 -d 1]", url],
      { stdio: ["ignore", "pipe", "inherit"] },
    )
    let out = ""
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString()
    })
    child.on("error", reject)
    child.on("exit", (code) => {
      if (code !== 0) return reject(new Error(`autocannon exited with ${code}`))
      // With a warm-up, autocannon prints the warm-up's result first; the last line is the run.
      const r = JSON.parse(out.trim().split("\n").at(-1)!)
      resolve({
        rps: r.requests.average,
        p50: r.latency.p50,
        p99: r.latency.p99,
        errors: r.errors + r.timeouts,
        non2xx: r.non2xx,
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
  }, 60_000)
  // The access log is rendered as in production and thrown away, so its cost is measured.
  const logged = { lines: 0 }
  const scope = Effect.runSync(Scope.make())
  const layer = Server.layer(Health.routes).pipe(
    Layer.provide(RateLimit.layer),
    Layer.provide(RateLimit.RateLimitSettings.layer({ perSecond: 1e9, burst: 1e9 })),
    Layer.provide(Server.HttpSettings.layer({ addr: "127.0.0.1:0" })),
  )
  const context = await Effect.runPromise(
    Layer.buildWithScope(layer, scope).pipe(
      Effect.provide(
        Logger.replace(
          Logger.defaultLogger,
          jsonLogger(() => {
            logged.lines++
          }),
        ),
      ),
    ),
  )
  const gateway = Context.get(context, Server.Server)
  const baseline = await bare()

  const b = await drive(`http://127.0.0.1:${baseline.port}/v1/health`)
  const g = await drive(`${gateway.url}/v1/health`)
  baseline.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  clearTimeout(guard)

  const row = (name: string, f: Figures) =>
    `${name.padEnd(10)} ${f.rps.toFixed(0).padStart(8)} req/s   p50 ${String(f.p50).padStart(4)} ms   p99 ${String(f.p99).padStart(4)} ms   errors ${f.errors}   non-2xx ${f.non2xx}`
  console.log(`GET /v1/health, ${connections} connections, ${seconds} s each, autocannon in a child process`)
  console.log(row("bare uWS", b))
  console.log(row("gateway", g))
  console.log(`gateway/bare throughput ratio ${(g.rps / b.rps).toFixed(2)}; access log lines ${logged.lines}`)
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${e}\n`)
    process.exit(1)
  },
)
