/**
 * The account's money and webhook key over real HTTP: a gateway, an account-actor worker and a
 * nats-server; credit given by `hangar admin credit` as an operator runs it (a real process).
 */
import { execFile } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AccountWorker, startAccountWorker } from "../../actors/account/testing.ts"
import type { AccountRecord } from "../../core/Accounts.ts"
import { clientLayer } from "../../core/actors/testing/Harness.ts"
import * as Ledger from "../../core/Ledger.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { personToken, run, startGateway, type TestGateway } from "../auth/testing.ts"
import { routes } from "./routes.ts"

const exec = promisify(execFile)
const bin = join(import.meta.dirname, "..", "..", "cli", "bin.cjs")

let nats: StartedNatsServer
let dir: string
let gateway: TestGateway
let worker: AccountWorker
let account: AccountRecord
let owner: Record<string, string>
let env: NodeJS.ProcessEnv
let prefix: string
let keyFile: string

// biome-ignore lint/suspicious/noExplicitAny: response bodies are inspected loosely
type Json = any

const get = async (path: string, headers = owner): Promise<{ status: number; body: Json }> => {
  const res = await fetch(`${gateway.url}${path}`, { headers })
  return { status: res.status, body: await res.json() }
}

const admin = async (...args: Array<string>) => {
  try {
    const { stdout, stderr } = await exec(process.execPath, [bin, "admin", ...args], {
      env,
      timeout: 60_000,
    })
    return { code: 0, stdout, stderr }
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string }
    return { code: err.code, stdout: err.stdout, stderr: err.stderr }
  }
}
const credit = (...args: Array<string>) => admin("credit", ...args)

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-usage-"))
  keyFile = join(dir, "issuer.key")
  prefix = uniquePrefix()
  env = { ...process.env, HANGAR_NATS_URL: nats.url, HANGAR_STORAGE_PREFIX: prefix, HANGAR_DATA_DIR: dir }
  gateway = await startGateway(routes, { natsUrl: nats.url, prefix, keyFile })
  worker = await Effect.runPromise(startAccountWorker(nats.url, prefix))
  account = (await run(gateway.accounts.createAccount("acme", "owner@example.com"))).account
  owner = {
    authorization: `Bearer ${await personToken(keyFile, "owner@example.com")}`,
    "service-account": account.id,
  }
}, 60_000)

afterAll(async () => {
  if (worker) await Effect.runPromise(worker.stop)
  await gateway?.close()
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("usage, balance and webhook key", () => {
  it("a new account shows a zero balance, no entries, and one stable webhook key", async () => {
    const usage = await get("/v1/usage")
    expect(usage).toEqual({
      status: 200,
      body: {
        balance: {
          account: account.id,
          balance_usd_nanos: 0,
          minimum_balance_usd_nanos: 0,
          currency: "usd",
          available_usd_nanos: 0,
        },
        entries: [],
      },
    })
    const keys = await get("/v1/webhooks/public-key")
    expect(keys.status).toBe(200)
    expect(keys.body.keys).toHaveLength(1)
    expect(keys.body.keys[0]).toMatch(/^whpk_[A-Za-z0-9+/]{43}=$/)
    const me = await get("/v1/account")
    expect(me.status).toBe(200)
    expect(me.body.webhook_public_key).toBe(keys.body.keys[0])
    expect((await get("/v1/webhooks/public-key")).body).toEqual(keys.body)
  })

  it("GET /v1/account answers each person with their own role, and the account as it is now", async () => {
    // A member beside the owner, in through an invite as a person would be.
    const ownerUser = (await run(gateway.accounts.ensureUser("owner@example.com"))).user
    await run(gateway.accounts.invite(account, "member@example.com", "member", ownerUser))
    await run(
      gateway.accounts.acceptInvite(account.id, await run(gateway.accounts.ensureUser("member@example.com"))),
    )
    const member = {
      authorization: `Bearer ${await personToken(keyFile, "member@example.com")}`,
      "service-account": account.id,
    }
    await expect.poll(async () => (await get("/v1/account", member)).status).toBe(200)
    // In turn, and each twice: an answer kept for one is never the other's.
    for (const [who, role] of [
      [owner, "owner"],
      [member, "member"],
      [member, "member"],
      [owner, "owner"],
      [owner, "owner"],
      [member, "member"],
    ] as const) {
      const me = await get("/v1/account", who)
      expect(me.status).toBe(200)
      expect(me.body).toMatchObject({ id: account.id, state: "active", role })
      expect(me.body.webhook_public_key).toMatch(/^whpk_/)
    }
    // A change to the account is in the next answers, for both.
    await run(gateway.accounts.setState(account.id, "suspended"))
    try {
      await expect.poll(async () => (await get("/v1/account")).body.state).toBe("suspended")
      expect((await get("/v1/account", member)).body).toMatchObject({ state: "suspended", role: "member" })
      expect((await get("/v1/account")).body).toMatchObject({ state: "suspended", role: "owner" })
    } finally {
      await run(gateway.accounts.setState(account.id, "active"))
    }
    await expect.poll(async () => (await get("/v1/account")).body.state).toBe("active")
  })

  it("create-account --credit-usd makes the account with one adjustment entry; a bad amount makes nothing", async () => {
    const made = await admin(
      "create-account",
      "--name",
      "funded",
      "--owner",
      "funder@example.com",
      "--credit-usd",
      "25",
    )
    expect(made.code).toBe(0)
    const out = JSON.parse(made.stdout)
    expect(out.account).toMatchObject({ name: "funded", state: "active" })
    expect(out.credit).toMatchObject({
      balance_usd_nanos: 25_000_000_000,
      entry: { account: out.account.id, kind: "adjustment", amount_usd_nanos: 25_000_000_000 },
    })
    const entries = await run(Ledger.read(out.account.id).pipe(Effect.provide(clientLayer(nats.url, prefix))))
    expect(entries.map((e) => [e.kind, e.amount_usd_nanos])).toEqual([["adjustment", 25_000_000_000]])
    const accountsBefore = await run(gateway.accounts.views.accounts.keys(">"))
    // At once: each is a whole process start (seconds each on a busy 2-core machine).
    const bads = ["0", "-5", "1.0000000001", "ten"]
    const refusals = await Promise.all(
      bads.map((bad) =>
        admin("create-account", "--name", "nope", "--owner", "nope@example.com", "--credit-usd", bad),
      ),
    )
    expect(refusals.map((r, i) => ({ bad: bads[i], code: r.code, stdout: r.stdout }))).toEqual(
      bads.map((bad) => ({ bad, code: 2, stdout: "" })),
    )
    for (const refused of refusals) expect(refused.stderr).toContain("--credit-usd")
    expect(await run(gateway.accounts.views.accounts.keys(">"))).toEqual(accountsBefore)
  }, 120_000)

  it("admin credit adds and takes credit; /v1/usage and /v1/account show it", async () => {
    const added = await credit("--account", account.id, "--usd", "12.5")
    expect(added.code).toBe(0)
    const first = JSON.parse(added.stdout)
    expect(first).toMatchObject({
      account: account.id,
      balance_usd_nanos: 12_500_000_000,
      entry: { account: account.id, kind: "adjustment", amount_usd_nanos: 12_500_000_000 },
    })
    expect(first.entry.id).toMatch(/^led_/)
    const taken = await credit("--account", account.id, "--usd", "-0.000000001")
    expect(taken.code).toBe(0)
    const second = JSON.parse(taken.stdout)
    expect(second.balance_usd_nanos).toBe(12_499_999_999)

    const usage = await get("/v1/usage")
    expect(usage.status).toBe(200)
    expect(usage.body.balance.balance_usd_nanos).toBe(12_499_999_999)
    expect(usage.body.balance.available_usd_nanos).toBe(12_499_999_999)
    expect(usage.body.entries).toEqual([first.entry, second.entry])
    const me = await get("/v1/account")
    expect(me.body.balance).toEqual(usage.body.balance)
  }, 120_000)

  it("admin credit refuses bad amounts (exit 2) and unknown accounts (exit 4), printing nothing", async () => {
    // At once: each is a whole process start (seconds each on a busy 2-core machine).
    const bads = ["abc", "1.0000000001", "0", "1e3", "99999999999"]
    const refusals = await Promise.all(bads.map((usd) => credit("--account", account.id, "--usd", usd)))
    expect(refusals.map((r, i) => ({ usd: bads[i], code: r.code, stdout: r.stdout }))).toEqual(
      bads.map((usd) => ({ usd, code: 2, stdout: "" })),
    )
    // The largest amount the balance can hold is accepted; one nanodollar more is refused by the
    // actor (exit 4) and leaves no ledger entry.
    const rich = (await run(gateway.accounts.createAccount("rich", "rich@example.com"))).account
    const [ok, missing] = await Promise.all([
      credit("--account", rich.id, "--usd", "9007199.254740991"),
      credit("--account", "acc_00000000000000000000000000", "--usd", "1"),
    ])
    expect(ok.code).toBe(0)
    expect(JSON.parse(ok.stdout).balance_usd_nanos).toBe(Number.MAX_SAFE_INTEGER)
    const over = await credit("--account", rich.id, "--usd", "0.000000001")
    expect(over.code).toBe(4)
    expect(over.stderr).toContain("largest safe integer")
    const entries = await run(Ledger.read(rich.id).pipe(Effect.provide(clientLayer(nats.url, prefix))))
    expect(entries).toHaveLength(1)
    expect(missing.code).toBe(4)
    expect(missing.stdout).toBe("")
    expect(missing.stderr).toContain("account not found")
  }, 120_000)
})
