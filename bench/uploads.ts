// Upload throughput: a generated file PUT through the gateway (its own process, the uploads routes:
// hash + seal + object store on a real nats-server) beside a raw loopback copy of the same bytes to
// a bare node:http sink, in the same run. Prints MB/s of both and the ratio; the goal is ≥ 100 MB/s
// through the gateway. No assertions. Run: node --import tsx bench/uploads.ts [MiB, default 1024]
//
// Both bodies are sent chunked: the uWS build in use refuses a content-length of 1e9 or more.
import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import http from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { generated, rssOf, sendBody, sha256Of, startChildGateway } from "../gateway/uploads/spawn.ts"
import { startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const MiB = 1024 * 1024
const total = Number(process.argv[2] ?? 1024) * MiB
const pool = randomBytes(MiB)
const chunked = { "content-type": "application/octet-stream" }

const report = (label: string, seconds: number) => {
  const mbs = total / 1e6 / seconds
  console.log(`${label.padEnd(44)} ${mbs.toFixed(0).padStart(6)} MB/s  (${seconds.toFixed(2)} s)`)
  return mbs
}

const timed = async (run: () => Promise<void>) => {
  const start = process.hrtime.bigint()
  await run()
  return Number(process.hrtime.bigint() - start) / 1e9
}

// Raw loopback: a node:http sink that counts and drops the body.
const sink = http.createServer((req, res) => {
  let n = 0
  req.on("data", (d: Buffer) => {
    n += d.length
  })
  req.on("end", () => res.end(JSON.stringify({ bytes: n })))
})
await new Promise<void>((resolve) => sink.listen(0, "127.0.0.1", resolve))
const sinkUrl = `http://127.0.0.1:${(sink.address() as AddressInfo).port}/sink`
const raw = report(
  "raw loopback copy (node:http sink)",
  await timed(async () => {
    const res = await sendBody(sinkUrl, "PUT", chunked, generated(total, pool))
    if (JSON.parse(res.body).bytes !== total) throw new Error(`sink got ${res.body}`)
  }),
)
sink.close()

const nats = await startNatsServer()
const dir = await mkdtemp(join(tmpdir(), "hangar-bench-uploads-"))
const gateway = await startChildGateway({ natsUrl: nats.url, prefix: uniquePrefix(), dir })
try {
  const sha256 = sha256Of(generated(total, pool))
  const made = await fetch(`${gateway.url}/v1/files`, {
    method: "POST",
    headers: { authorization: `Bearer ${gateway.token}`, "content-type": "application/json" },
    body: JSON.stringify({ bytes: total, sha256 }),
  })
  const link = (await made.json()) as { url: string }
  const before = await rssOf(gateway.pid)
  let peak = before
  const sampler = setInterval(() => {
    rssOf(gateway.pid).then(
      (r) => {
        peak = Math.max(peak, r)
      },
      () => undefined,
    )
  }, 200)
  const through = report(
    "gateway PUT → sha256 + seal + object store",
    await timed(async () => {
      const res = await sendBody(link.url, "PUT", chunked, generated(total, pool))
      if (res.status !== 200) throw new Error(`upload answered ${res.status} ${res.body}`)
    }),
  )
  clearInterval(sampler)
  console.log(`gateway / raw: ${(through / raw).toFixed(3)}   (goal: gateway ≥ 100 MB/s)`)
  console.log(`gateway RSS ${(before / MiB).toFixed(0)} MiB before, peak ${(peak / MiB).toFixed(0)} MiB`)
} finally {
  await gateway.stop()
  await nats.stop()
  await rm(dir, { recursive: true, force: true })
}
