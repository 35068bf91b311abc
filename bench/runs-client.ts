/**
 * The caller of `bench/runs.ts`, in its own process as a caller is: `node --import tsx
 * bench/runs-client.ts <url> <headers JSON> <function id> <runs> <commands> [blocks]`. One
 * keep-alive connection (a client's usual reuse) through `node:http`, not `fetch`: undici's `fetch`
 * took twice the CPU here (1.9 against 0.9 ms per command), and the caller shares this machine's
 * two cores with the guest, whose `bash` that slows (one core kept busy takes a bare exec from 2.7
 * to 4.2 ms). Tells its parent `{ started: runId }` for every run it starts, `{ step }` as a run
 * one after another passes each step (`start`, about to ask; `first`, its first result; `finish`,
 * its finish answered; `ended`, seen ended; each awaited, so the parent counts its CPU up to it
 * before the next request; a paced run's first result is `paced first`), and `{ phase: "paced" }`
 * between the runs one after another and the paced ones; runs the round-trip phase in `blocks`
 * blocks, each between `{ block: "start" }` and `{ block: "end", size }` (its command count) and
 * followed by a wait for any message from the parent; then as many commands sent in one request
 * (`POST …/commands?wait=25`, the create answering the ended command) in blocks marked
 * `{ phase: "one" }`; and at last `{ first, paced, pacedMs, succeeded, rtt, rttOne }`:
 * milliseconds from `POST …/runs` to the first `bash true` result with runs one after another, and
 * again with a run started every `pacedMs`; from a finish (`succeeded`, its output written) to its
 * answer, a run every `pacedMs` or so; and per command round trip, in two requests and in one.
 */
import { Agent, request } from "node:http"

type Json = Record<string, unknown>

const [url = "", headersJson = "{}", fn = "", runsArg = "50", commandsArg = "200", blocksArg = "1"] =
  process.argv.slice(2)
const headers = JSON.parse(headersJson) as Record<string, string>
const send = (m: unknown) => process.send?.(m)

const agent = new Agent({ keepAlive: true, maxSockets: 1 })
const base = new URL(url)

const api = (method: string, path: string, body?: unknown): Promise<Json> =>
  new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body)
    const req = request(
      {
        agent,
        host: base.hostname,
        port: base.port,
        method,
        path,
        headers: {
          ...headers,
          ...(data === undefined
            ? {}
            : { "content-type": "application/json", "content-length": Buffer.byteLength(data) }),
        },
      },
      (res) => {
        const chunks: Array<Buffer> = []
        res.on("data", (c: Buffer) => chunks.push(c))
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8")
          if ((res.statusCode ?? 0) >= 300)
            return reject(new Error(`${method} ${path}: ${res.statusCode} ${text}`))
          try {
            resolve(JSON.parse(text) as Json)
          } catch (e) {
            reject(e)
          }
        })
        res.on("error", reject)
      },
    )
    req.on("error", reject)
    req.end(data)
  })

/** Sends `bash true` in one request that waits for its end (`POST …?wait=25`); answers the ended record. */
const bashTrueOne = async (run: string) => {
  const sent = await api("POST", `/v1/runs/${run}/commands?wait=25`, {
    kind: "bash",
    arguments: { command: "true" },
  })
  if (sent.state !== "succeeded") throw new Error(`bash true in one request answered ${JSON.stringify(sent)}`)
  return sent
}

/** Sends `bash true` and waits for its end; answers the ended record. */
const bashTrue = async (run: string) => {
  const sent = await api("POST", `/v1/runs/${run}/commands`, { kind: "bash", arguments: { command: "true" } })
  for (;;) {
    const c = await api("GET", `/v1/runs/${run}/commands/${sent.id}?wait=25`)
    if (c.state === "succeeded" || c.state === "failed" || c.state === "cancelled") {
      if (c.state !== "succeeded") {
        const r = await api("GET", `/v1/runs/${run}`)
        throw new Error(`bash true ended ${c.state}: ${JSON.stringify(c)}; the run: ${JSON.stringify(r)}`)
      }
      return c
    }
  }
}

const start = async () => {
  const run = await api("POST", `/v1/functions/${fn}/runs`, { prompt: "bench" })
  send({ started: run.id })
  return String(run.id)
}

/** Tells the parent a run one after another reached `step`, once it has taken the message. */
const step = (name: string) => new Promise<void>((ok) => process.send?.({ step: name }, () => ok()) ?? ok())

/** Finishes the run as failed and waits for it to end (the next start should find the room free). */
const finish = async (run: string, answered?: () => Promise<void>) => {
  await api("POST", `/v1/runs/${run}/commands`, { kind: "finish", arguments: { state: "failed" } })
  await answered?.()
  for (;;) {
    const r = await api("GET", `/v1/runs/${run}`)
    if (r.state === "succeeded" || r.state === "failed") return
    await new Promise((ok) => setTimeout(ok, 20))
  }
}

const first: Array<number> = []
for (let i = 0; i < Number(runsArg); i++) {
  await step("start")
  const t0 = performance.now()
  const run = await start()
  await bashTrue(run)
  first.push(performance.now() - t0)
  await step("first")
  await finish(run, () => step("finish"))
  await step("ended")
}
// The same, a run started every `pacedMs` (as callers that are not one loop start them): what a
// start costs once the host has caught up with the last one (warm machines made again).
const pacedMs = 500
const paced: Array<number> = []
send({ phase: "paced" })
for (let i = 0; i < Math.ceil(Number(runsArg) / 2); i++) {
  await step("start")
  const t0 = performance.now()
  const run = await start()
  await bashTrue(run)
  paced.push(performance.now() - t0)
  await step("paced first")
  await finish(run)
  await new Promise((ok) => setTimeout(ok, Math.max(0, pacedMs - (performance.now() - t0))))
}

// Runs that succeed, paced as above: the output file the function's manifest names is written,
// then the finish (`succeeded`) is sent in one request, which answers once the folder is checked,
// listed, packed and stored; the time from it to its answer.
const succeeded: Array<number> = []
for (let i = 0; i < Math.ceil(Number(runsArg) / 3); i++) {
  const run = await start()
  const wrote = await api("POST", `/v1/runs/${run}/commands?wait=25`, {
    kind: "bash",
    arguments: { command: "echo done > /workspace/out/result.txt" },
  })
  if (wrote.state !== "succeeded") throw new Error(`writing the output answered ${JSON.stringify(wrote)}`)
  await new Promise((ok) => setTimeout(ok, pacedMs / 2))
  const t0 = performance.now()
  const done = await api("POST", `/v1/runs/${run}/commands?wait=25`, {
    kind: "finish",
    arguments: { state: "succeeded" },
  })
  succeeded.push(performance.now() - t0)
  const result = done.result as Json | undefined
  if (done.state !== "succeeded" || result?.accepted !== true)
    throw new Error(`the finish answered ${JSON.stringify(done)}`)
  for (;;) {
    const r = await api("GET", `/v1/runs/${run}`)
    if (r.state === "succeeded") break
    if (r.state === "failed") throw new Error(`the run failed: ${JSON.stringify(r)}`)
    await new Promise((ok) => setTimeout(ok, 20))
  }
  await new Promise((ok) => setTimeout(ok, pacedMs / 2))
}

const run = await start()
await bashTrue(run)
// In blocks: between two, the parent measures the bare exec baseline while this waits, so both
// figures come from the same minutes of the machine (its speed drifts).
const blocks = Number(blocksArg)
/** The commands' round trips with `command`, in blocks each followed by the parent's baseline block. */
const inBlocks = async (command: (run: string) => Promise<unknown>, phase?: string) => {
  const times: Array<number> = []
  for (let b = 0; b < blocks; b++) {
    const size = Math.floor(Number(commandsArg) / blocks) + (b < Number(commandsArg) % blocks ? 1 : 0)
    send({ block: "start", phase })
    for (let j = 0; j < size; j++) {
      const t = performance.now()
      await command(run)
      times.push(performance.now() - t)
    }
    send({ block: "end", size, phase })
    await new Promise((resolve) => process.once("message", resolve))
  }
  return times
}
const rtt = await inBlocks(bashTrue)
const rttOne = await inBlocks(bashTrueOne, "one")
await finish(run)
process.send?.({ first, paced, pacedMs, succeeded, rtt, rttOne }, () => process.exit(0))
