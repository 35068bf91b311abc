/**
 * A 2 GiB upload, generated on the fly, through a gateway running in its own process into the
 * object store of a real nats-server: it is stored whole, and the gateway's resident memory grows
 * by less than 100 MB while it streams (sampled from `/proc/<pid>/status`).
 */
import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, expect, it } from "vitest"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { type ChildGateway, generated, rssOf, sendBody, sha256Of, startChildGateway } from "./spawn.ts"

const MiB = 1024 * 1024
const TOTAL = 2 * 1024 * MiB
const pool = randomBytes(MiB)

let nats: StartedNatsServer
let dir: string
let gateway: ChildGateway

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-uploads-heavy-"))
  gateway = await startChildGateway({ natsUrl: nats.url, prefix: uniquePrefix(), dir })
})

afterAll(async () => {
  await gateway?.stop()
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

// Sent with exactly the answered headers: from 1e9 bytes they hold no content-length (the uWS build
// refuses ten digits), so the body goes chunked, which the route counts as it arrives.
const upload = async (total: number) => {
  const sha256 = sha256Of(generated(total, pool))
  const made = await fetch(`${gateway.url}/v1/files`, {
    method: "POST",
    headers: { authorization: `Bearer ${gateway.token}`, "content-type": "application/json" },
    body: JSON.stringify({ bytes: total, sha256 }),
  })
  expect(made.status).toBe(201)
  const link = (await made.json()) as { id: string; url: string; headers: Record<string, string> }
  const res = await sendBody(link.url, "PUT", link.headers, generated(total, pool))
  return { link, sha256, res }
}

it("a 2 GiB upload is stored whole with the gateway's memory growing by less than 100 MB", async () => {
  // Warm up (code paths, pools, the account's data key) so the baseline is the running state.
  const warm = await upload(64 * MiB)
  expect(warm.res.status).toBe(200)
  const baseline = await rssOf(gateway.pid)
  let peak = baseline
  let sampling = true
  const sampler = (async () => {
    while (sampling) {
      peak = Math.max(peak, await rssOf(gateway.pid))
      await new Promise((r) => setTimeout(r, 100))
    }
  })()
  const { link, sha256, res } = await upload(TOTAL).finally(() => {
    sampling = false
  })
  await sampler
  expect(res.status).toBe(200)
  expect(JSON.parse(res.body)).toEqual({ id: link.id, bytes: TOTAL, sha256 })
  console.log(`gateway RSS baseline ${(baseline / MiB).toFixed(0)} MiB, peak ${(peak / MiB).toFixed(0)} MiB`)
  expect(peak - baseline).toBeLessThan(100_000_000)
}, 240_000)
