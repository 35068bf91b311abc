/**
 * The caller of `bench/runs.ts`, in its own process as a caller is: `node --import tsx
 * bench/runs-client.ts <url> <headers JSON> <function id> <runs> <commands>`. Keep-alive `fetch`
 * (a client's usual connection reuse). Tells its parent `{ started: runId }` for every run it
 * starts, `{ commands: "start" }` / `{ commands: "end" }` around the round-trip phase, and at last
 * `{ first, rtt }`: milliseconds from `POST …/runs` to the first `bash true` result, and per
 * command round trip.
 */
type Json = Record<string, unknown>

const [url = "", headersJson = "{}", fn = "", runsArg = "50", commandsArg = "200"] = process.argv.slice(2)
const headers = JSON.parse(headersJson) as Record<string, string>
const send = (m: unknown) => process.send?.(m)

const api = async (method: string, path: string, body?: unknown): Promise<Json> => {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return JSON.parse(text) as Json
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

/** Finishes the run as failed and waits for it to end (the next start should find the room free). */
const finish = async (run: string) => {
  await api("POST", `/v1/runs/${run}/commands`, { kind: "finish", arguments: { state: "failed" } })
  for (;;) {
    const r = await api("GET", `/v1/runs/${run}`)
    if (r.state === "succeeded" || r.state === "failed") return
    await new Promise((ok) => setTimeout(ok, 20))
  }
}

const first: Array<number> = []
for (let i = 0; i < Number(runsArg); i++) {
  const t0 = performance.now()
  const run = await start()
  await bashTrue(run)
  first.push(performance.now() - t0)
  await finish(run)
}

const run = await start()
await bashTrue(run)
const rtt: Array<number> = []
send({ commands: "start" })
for (let j = 0; j < Number(commandsArg); j++) {
  const t = performance.now()
  await bashTrue(run)
  rtt.push(performance.now() - t)
}
send({ commands: "end" })
await finish(run)
process.send?.({ first, rtt }, () => process.exit(0))
