/**
 * CLI logins end to end over real HTTP against a gateway over a real nats-server: the CLI side
 * makes a real `hgr_` token and sends only its SHA-256, an owner approves with the code, and the
 * CLI's token then authenticates as an admin key named after the machine.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Layer, Option } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { AccountRecord } from "../../core/Accounts.ts"
import { hashToken, newToken } from "../../core/KeyTokens.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import * as Keys from "../accounts/Keys.ts"
import { authRoute } from "../auth/Route.ts"
import { personToken } from "../auth/testing.ts"
import { json } from "../Response.ts"
import { CliLoginSettings, CliLogins, layer as loginsLayer, newCode, normalizeCode } from "./CliLogins.ts"
import { routes as loginRoutes } from "./routes.ts"
import { call, startGateway, type TestGateway } from "./testing.ts"

// A member route to prove the CLI's token works (and as what).
const probe = authRoute({
  method: "GET",
  path: "/t/whoami",
  access: "member (admin keys)",
  handler: ({ principal }) =>
    Effect.succeed(
      json(
        principal._tag === "AccountKey"
          ? {
              key: principal.key.id,
              name: principal.key.name,
              scope: principal.key.scope,
              account: principal.account.id,
            }
          : { user: principal.user },
      ),
    ),
})

let nats: StartedNatsServer
let dir: string
let gw: TestGateway
let account: AccountRecord
let other: AccountRecord
let owner: Record<string, string>
let otherOwner: Record<string, string>
let member: Record<string, string>

const consoleUrl = "https://console.hangar.test/"

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-logins-"))
  const keyFile = join(dir, "issuer.key")
  gw = await startGateway([...loginRoutes, ...Keys.routes, probe], {
    natsUrl: nats.url,
    prefix: uniquePrefix(),
    keyFile,
    services: loginsLayer.pipe(Layer.provideMerge(CliLoginSettings.layer({ consoleUrl }))),
  })
  const made = await gw.run(gw.accounts.createAccount("acme", "owner@example.com"))
  account = made.account
  other = (await gw.run(gw.accounts.createAccount("other", "other@example.com"))).account
  await gw.run(gw.accounts.invite(account, "member@example.com", "member", made.owner.user))
  await gw.run(
    gw.accounts.acceptInvite(account.id, await gw.run(gw.accounts.ensureUser("member@example.com"))),
  )
  const bearer = async (email: string, acc: string) => ({
    authorization: `Bearer ${await personToken(keyFile, email)}`,
    "service-account": acc,
  })
  owner = await bearer("owner@example.com", account.id)
  member = await bearer("member@example.com", account.id)
  otherOwner = await bearer("other@example.com", other.id)
})

afterAll(async () => {
  await gw?.close()
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

/** The CLI's side: a fresh token, and a login started with its hash. */
const startLogin = async (name = "laptop") => {
  const token = newToken()
  const res = await call(gw, "POST", "/v1/cli-logins", {}, { name, key_hash: hashToken(token) })
  expect(res.status).toBe(201)
  return { token, login: res.body as { id: string; code: string; url: string; expires_at: number } }
}

const approve = (id: string, code: string, headers = owner) =>
  call(gw, "POST", `/v1/cli-logins/${id}/approve`, headers, { code })

describe("codes", () => {
  it("are XXXX-XXXX from an unambiguous alphabet and compare loosely", () => {
    for (let i = 0; i < 200; i++) expect(newCode()).toMatch(/^[A-HJKMNP-TV-Z2-9]{4}-[A-HJKMNP-TV-Z2-9]{4}$/)
    expect(normalizeCode(" abcd-efgh ")).toBe("ABCDEFGH")
  })
})

describe("a CLI login", () => {
  it("is created pending, approved by an owner with the code, and the CLI's token then works", async () => {
    const before = Math.floor(Date.now() / 1000)
    const { token, login } = await startLogin("build-box")
    expect(login.id).toMatch(/^login_[0-9a-hjkmnp-tv-z]{26}$/)
    expect(login.code).toMatch(/^[A-Z2-9]{4}-[A-Z2-9]{4}$/)
    expect(login.url).toBe(`https://console.hangar.test/cli-logins/${login.id}?code=${login.code}`)
    // Ten minutes from creation (seconds, rounded down).
    expect(login.expires_at).toBeGreaterThanOrEqual(before + 600 - 1)
    expect(login.expires_at).toBeLessThanOrEqual(Math.floor(Date.now() / 1000) + 600)

    // Before approval: pending, and the token is not a key yet.
    const pending = await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})
    expect(pending).toEqual({
      status: 200,
      body: { id: login.id, name: "build-box", state: "pending", expires_at: login.expires_at },
    })
    expect((await call(gw, "GET", "/t/whoami", { authorization: `Bearer ${token}` })).status).toBe(401)

    // The person retypes the code in another case with spaces: still the same code.
    const ok = await approve(login.id, ` ${login.code.toLowerCase()} `)
    expect(ok.status).toBe(200)
    expect(ok.body).toMatchObject({ id: login.id, state: "approved", account: account.id })
    const keyId = ok.body.key as string
    expect(keyId).toMatch(/^key_/)

    const read = await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})
    expect(read.body).toEqual({
      id: login.id,
      name: "build-box",
      state: "approved",
      expires_at: login.expires_at,
      account: account.id,
      key: keyId,
    })

    // The CLI's own secret authenticates as an admin key named after the machine, without Service-Account.
    const who = await call(gw, "GET", "/t/whoami", { authorization: `Bearer ${token}` })
    expect(who).toEqual({
      status: 200,
      body: { key: keyId, name: "build-box", scope: "admin", account: account.id },
    })

    // The owner sees the key in the list, created by them; no secret and no code appear anywhere.
    const keys = await call(gw, "GET", "/v1/keys", owner)
    const listed = (
      keys.body.keys as Array<{ id: string; name: string; scope: string; functions: Array<string> }>
    ).find((k) => k.id === keyId)
    expect(listed).toMatchObject({ name: "build-box", scope: "admin", functions: ["*"] })
    expect(JSON.stringify(read.body)).not.toContain(login.code)
    expect(gw.lines.join("\n")).not.toContain(token)
  })

  it("approved twice makes one key, and the second answer is the same login", async () => {
    const { token, login } = await startLogin("twice")
    const [a, b] = await Promise.all([approve(login.id, login.code), approve(login.id, login.code)])
    expect([a.status, b.status]).toEqual([200, 200])
    expect(a.body.key).toBe(b.body.key)
    const again = await approve(login.id, login.code)
    expect(again.body).toEqual(a.body)
    const keys = (await call(gw, "GET", "/v1/keys", owner)).body.keys as Array<{ name: string; id: string }>
    expect(keys.filter((k) => k.name === "twice").map((k) => k.id)).toEqual([a.body.key])
    expect((await call(gw, "GET", "/t/whoami", { authorization: `Bearer ${token}` })).body.key).toBe(
      a.body.key,
    )
  })

  it("refuses a wrong code (400 naming code) and stays pending for the right one", async () => {
    const { login } = await startLogin()
    const wrong = login.code === "AAAA-AAAA" ? "BBBB-BBBB" : "AAAA-AAAA"
    const res = await approve(login.id, wrong)
    expect(res.status).toBe(400)
    expect(res.body.code).toBe("invalid_request")
    expect(res.body.error).toMatch(/^code:/)
    expect((await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})).body.state).toBe("pending")
    expect((await approve(login.id, login.code)).body.state).toBe("approved")
  })

  it("expires 10 minutes after creation: reads expired and cannot be approved", async () => {
    const { token, login } = await startLogin("late")
    // Move the stored expiry to now (the boundary: expired at expires_at) rather than wait.
    const now = Math.floor(Date.now() / 1000)
    await gw.run(
      Effect.gen(function* () {
        const { kv } = yield* CliLogins
        const found = yield* kv.get(login.id)
        if (Option.isNone(found)) throw new Error("login not stored")
        yield* kv.put(login.id, { ...found.value.value, expires_at: now })
      }),
    )
    const read = await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})
    expect(read.body).toEqual({ id: login.id, name: "late", state: "expired", expires_at: now })
    const res = await approve(login.id, login.code)
    expect(res.status).toBe(400)
    expect(res.body.error).toMatch(/expired/)
    expect((await call(gw, "GET", "/t/whoami", { authorization: `Bearer ${token}` })).status).toBe(401)
  })

  it("one second before expiry it is still pending and can be approved", async () => {
    const { login } = await startLogin("just-in-time")
    const at = Math.floor(Date.now() / 1000) + 2
    await gw.run(
      Effect.gen(function* () {
        const { kv } = yield* CliLogins
        const found = yield* kv.get(login.id)
        if (Option.isNone(found)) throw new Error("login not stored")
        yield* kv.put(login.id, { ...found.value.value, expires_at: at })
      }),
    )
    expect((await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})).body.state).toBe("pending")
    expect((await approve(login.id, login.code)).body.state).toBe("approved")
  })

  it("approved for one account cannot be approved for another", async () => {
    const { login } = await startLogin("mine")
    expect((await approve(login.id, login.code)).status).toBe(200)
    const res = await approve(login.id, login.code, otherOwner)
    expect(res.status).toBe(400)
    expect((await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})).body.account).toBe(account.id)
  })

  it("needs an owner to approve", async () => {
    const { login } = await startLogin()
    expect((await approve(login.id, login.code, member)).body.code).toBe("owners_only")
    expect((await approve(login.id, login.code, {})).body.code).toBe("unauthenticated")
    expect((await call(gw, "GET", `/v1/cli-logins/${login.id}`, {})).body.state).toBe("pending")
  })

  it("refuses a key_hash that already belongs to a key", async () => {
    const token = newToken()
    const first = (await call(gw, "POST", "/v1/cli-logins", {}, { name: "a", key_hash: hashToken(token) }))
      .body
    const second = (await call(gw, "POST", "/v1/cli-logins", {}, { name: "b", key_hash: hashToken(token) }))
      .body
    expect((await approve(first.id, first.code)).status).toBe(200)
    const res = await approve(second.id, second.code)
    expect(res.status).toBe(400)
    expect(res.body.error).toMatch(/^key_hash:/)
  })

  it("unknown or malformed ids are 404", async () => {
    for (const id of ["login_00000000000000000000000000", "nope", "key_00000000000000000000000000"]) {
      expect((await call(gw, "GET", `/v1/cli-logins/${id}`, {})).body.code).toBe("not_found")
      expect((await approve(id, "ABCD-EFGH")).body.code).toBe("not_found")
    }
  })
})

describe("bad bodies", () => {
  const hash = "a".repeat(64)
  const cases: ReadonlyArray<readonly [string, unknown, string]> = [
    ["no name", { key_hash: hash }, "name"],
    ["empty name", { name: "", key_hash: hash }, "name"],
    ["name over 256 bytes", { name: `${"é".repeat(128)}x`, key_hash: hash }, "name"],
    ["no key_hash", { name: "a" }, "key_hash"],
    ["upper-case hash", { name: "a", key_hash: "A".repeat(64) }, "key_hash"],
    ["short hash", { name: "a", key_hash: "a".repeat(63) }, "key_hash"],
    ["a token instead of its hash", { name: "a", key_hash: newToken() }, "key_hash"],
  ]
  for (const [what, body, field] of cases) {
    it(`${what} → 400 naming ${field}`, async () => {
      const res = await call(gw, "POST", "/v1/cli-logins", {}, body)
      expect(res.status).toBe(400)
      expect(res.body.code).toBe("invalid_request")
      expect(res.body.error).toContain(field)
    })
  }

  it("a name of exactly 256 bytes is accepted", async () => {
    const res = await call(gw, "POST", "/v1/cli-logins", {}, { name: "é".repeat(128), key_hash: hash })
    expect(res.status).toBe(201)
  })

  it("approve without a code, or with an empty one → 400 naming code", async () => {
    const { login } = await startLogin()
    for (const body of [{}, { code: "" }, { code: 7 }]) {
      const res = await call(gw, "POST", `/v1/cli-logins/${login.id}/approve`, owner, body)
      expect(res.status).toBe(400)
      expect(res.body.error).toContain("code")
    }
  })
})
