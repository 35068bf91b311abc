/**
 * Reads that list things must not leave server state behind: a burst of listings once filled the
 * nats-server's consumer limit (each `GET /v1/bases` made a JetStream consumer that outlived it by
 * minutes), and every account got `500 internal` until they expired. Every listing and read route,
 * thousands of times over, then the server's consumers are counted again.
 */
import { jetstreamManager } from "@nats-io/jetstream"
import { connect, type NatsConnection } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  call,
  closeStack,
  command,
  createAccount,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "./harness/Stack.ts"

let stack: Stack
let acct: TestAccount
let nc: NatsConnection

beforeAll(async () => {
  stack = await startStack({ logFlushMs: 500 })
  acct = await createAccount(stack, { creditUsd: 100 })
  nc = await connect({ servers: stack.env.NATS_URL! })
}, 120_000)

afterAll(async () => {
  await nc?.close()
  await closeStack(stack)
}, 120_000)

/** Every consumer on the server, by stream. */
const consumers = async (): Promise<Record<string, number>> => {
  const jsm = await jetstreamManager(nc)
  const out: Record<string, number> = {}
  for await (const s of jsm.streams.list()) {
    const list = await jsm.consumers.list(s.config.name).next()
    if (list.length > 0) out[s.config.name] = list.length
  }
  return out
}

/** Runs `f(0)` … `f(n - 1)`, 8 at a time; fails with the first failure. */
const burst = async (n: number, f: (i: number) => Promise<void>) => {
  let next = 0
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (next < n) await f(next++)
    }),
  )
}

describe("listings leave nothing behind", () => {
  it("5,000 GET /v1/bases in a burst, then every listing route, and the consumer count is where it started", async () => {
    const fn = await publish(stack, acct)
    const run = await startRun(stack, acct, fn.function)
    const bash = await command(stack, acct, run.id, "bash", { command: "echo hi" })
    expect(bash.state).toBe("succeeded")
    const before = await consumers()

    // A burst, as the one that filled the server's consumer limit: 8 requests in flight at a time.
    await burst(5_000, async (i) => {
      const r = await call(stack, "GET", "/v1/bases", acct.admin)
      if (r.status !== 200) throw new Error(`GET /v1/bases #${i}: ${r.status} ${JSON.stringify(r.body)}`)
    })
    const routes: Array<[string, Record<string, string>]> = [
      ["/v1/functions", acct.admin],
      ["/v1/runs", acct.admin],
      [`/v1/runs?function=${fn.function}`, acct.admin],
      [`/v1/runs/${run.id}`, acct.admin],
      [`/v1/runs/${run.id}/commands`, acct.admin],
      [`/v1/runs/${run.id}/commands/${bash.id}`, acct.admin],
      [`/v1/runs/${run.id}/commands/${bash.id}/output`, acct.admin],
      ["/v1/providers", acct.admin],
      ["/v1/tools", acct.admin],
      ["/v1/keys", acct.owner],
      ["/v1/members", acct.owner],
      ["/v1/invites", acct.owner],
      ["/v1/usage", acct.owner],
      ["/v1/account", acct.owner],
      ["/v1/me", acct.owner],
    ]
    for (const [path, headers] of routes) {
      const first = await call(stack, "GET", path, headers)
      expect(first.status, `GET ${path}: ${JSON.stringify(first.body)}`).toBeLessThan(300)
      await burst(199, async (i) => {
        const r = await call(stack, "GET", path, headers)
        if (r.status >= 500) throw new Error(`GET ${path} #${i + 1}: ${r.status} ${JSON.stringify(r.body)}`)
      })
    }
    // A read deletes its consumer without waiting for the server's answer: give the last ones a moment.
    let after = await consumers()
    for (let i = 0; i < 50 && JSON.stringify(after) !== JSON.stringify(before); i++) {
      await new Promise((r) => setTimeout(r, 100))
      after = await consumers()
    }
    expect(after).toEqual(before)
    // And the service still does its work.
    const again = await command(stack, acct, run.id, "bash", { command: "echo still" })
    expect(again.result?.output).toBe("still\n")
    expect((await publish(stack, acct, { name: "fn2" })).function).toMatch(/^fnc_/)
  }, 300_000)
})
