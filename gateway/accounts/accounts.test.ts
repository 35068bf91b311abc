/**
 * The people-and-keys routes end to end over real HTTP and a real nats-server: key life cycle and
 * revocation across two gateways, bad bodies changing nothing, invite expiry, the one-owner rule.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { AccountRecord } from "../../core/Accounts.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { authRoute } from "../auth/Route.ts"
import { personToken, run, startGateway, type TestGateway } from "../auth/testing.ts"
import { json } from "../Response.ts"
import { inviteBodyLimit } from "./Invites.ts"
import { keyBodyLimit } from "./Keys.ts"
import { routes } from "./routes.ts"

// A route keys may use, to see a key accepted or refused.
const probe = authRoute({
  method: "GET",
  path: "/t/member",
  access: "member",
  handler: ({ principal }) => Effect.succeed(json({ who: principal._tag })),
})
const served = [...routes, probe]

let nats: StartedNatsServer
let dir: string
let keyFile: string
let a: TestGateway
let b: TestGateway
let account: AccountRecord
let owner: Record<string, string>

// biome-ignore lint/suspicious/noExplicitAny: response bodies are inspected loosely
type Json = any

const call = async (
  gw: TestGateway,
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: string | object,
  contentType = "application/json",
): Promise<{ status: number; body: Json }> => {
  const res = await fetch(`${gw.url}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": contentType }) },
    ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
  })
  return { status: res.status, body: await res.json() }
}

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-accounts-"))
  keyFile = join(dir, "issuer.key")
  const prefix = uniquePrefix()
  // Two gateways on one nats-server and one storage: what two instances behind a balancer share.
  a = await startGateway(served, { natsUrl: nats.url, prefix, keyFile })
  b = await startGateway(served, { natsUrl: nats.url, prefix, keyFile })
  const made = await run(a.accounts.createAccount("acme", "Owner@Example.com"))
  account = made.account
  owner = {
    authorization: `Bearer ${await personToken(keyFile, "owner@example.com")}`,
    "service-account": account.id,
  }
})

afterAll(async () => {
  await a?.close()
  await b?.close()
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("keys", () => {
  it("a new key is shown once, listed without its secret, and works on the other gateway at once", async () => {
    const created = await call(a, "POST", "/v1/keys", owner, { name: "ci", scope: "admin" })
    expect(created.status).toBe(201)
    expect(created.body.token).toMatch(/^hgr_[A-Za-z0-9_-]{43}$/)
    expect(created.body.key).toMatchObject({
      account: account.id,
      name: "ci",
      scope: "admin",
      functions: ["*"],
    })
    const listed = await call(b, "GET", "/v1/keys", owner)
    const mine = listed.body.keys.find((k: Json) => k.id === created.body.key.id)
    expect(mine).toEqual(created.body.key)
    expect(JSON.stringify(listed.body)).not.toContain(created.body.token.slice(4))
    const stored = await run(a.accounts.views.keys.keys(">"))
    expect(stored.join(" ")).not.toContain(created.body.token.slice(4))
    const used = await call(b, "GET", "/t/member", { authorization: `Bearer ${created.body.token}` })
    expect(used).toEqual({ status: 200, body: { who: "AccountKey" } })
    // A people's route refuses the key as the spec says, and tells the caller where keys may go.
    const refused = await call(b, "GET", "/v1/account", { authorization: `Bearer ${created.body.token}` })
    expect(refused.status).toBe(403)
    expect(refused.body.code).toBe("people_only")
    for (const path of ["/v1/functions", "/v1/runs", "/v1/bases", "/v1/tools"])
      expect(refused.body.error).toContain(path)
  })

  it("revoking through gateway A refuses the very next request on gateway B", async () => {
    const created = await call(a, "POST", "/v1/keys", owner, {
      name: "soon-gone",
      scope: "run",
      functions: ["*"],
    })
    const bearer = { authorization: `Bearer ${created.body.token}` }
    // B has served the key, so it sits in B's cache.
    expect((await call(b, "GET", "/t/member", bearer)).status).toBe(200)
    expect((await call(b, "GET", "/t/member", bearer)).status).toBe(200)
    const revoked = await call(a, "DELETE", `/v1/keys/${created.body.key.id}`, owner)
    expect(revoked).toEqual({ status: 200, body: { revoked: created.body.key.id } })
    expect(await call(b, "GET", "/t/member", bearer)).toEqual({
      status: 401,
      body: { error: expect.any(String), code: "unauthenticated" },
    })
    expect((await call(a, "GET", "/t/member", bearer)).status).toBe(401)
    const listed = await call(b, "GET", "/v1/keys", owner)
    const entry = listed.body.keys.find((k: Json) => k.id === created.body.key.id)
    expect(entry.revoked_at).toEqual(expect.any(String))
    expect(entry.revoked_by).toBe((await call(a, "GET", "/v1/me", owner)).body.user)
  })

  it("revoking twice answers the same; an unknown or foreign key id is 404", async () => {
    const created = await call(a, "POST", "/v1/keys", owner, { name: "twice", scope: "admin" })
    const first = await call(a, "DELETE", `/v1/keys/${created.body.key.id}`, owner)
    const second = await call(b, "DELETE", `/v1/keys/${created.body.key.id}`, owner)
    expect(second).toEqual(first)
    expect((await call(a, "DELETE", "/v1/keys/key_00000000000000000000000000", owner)).status).toBe(404)
    expect((await call(a, "DELETE", "/v1/keys/not-an-id", owner)).status).toBe(404)
    const other = await run(a.accounts.createAccount("other", "other-owner@example.com"))
    const otherOwner = {
      authorization: `Bearer ${await personToken(keyFile, "other-owner@example.com")}`,
      "service-account": other.account.id,
    }
    const theirs = await call(a, "POST", "/v1/keys", otherOwner, { name: "theirs", scope: "admin" })
    expect((await call(a, "DELETE", `/v1/keys/${theirs.body.key.id}`, owner)).status).toBe(404)
    expect((await call(a, "GET", "/t/member", { authorization: `Bearer ${theirs.body.token}` })).status).toBe(
      200,
    )
  })
})

describe("bad bodies change nothing", () => {
  const padTo = (size: number, value: object): string => {
    const text = JSON.stringify(value)
    return text.slice(0, -1) + " ".repeat(size - text.length) + text.slice(-1)
  }
  const cases = (limit: number, good: object) =>
    [
      { name: "wrong type", body: { ...good, name: 5, email: 5 }, status: 400 },
      { name: "unknown field", body: { ...good, extra: true }, status: 400, field: "extra" },
      { name: "invalid JSON", body: "{not json", status: 400, field: "JSON" },
      {
        name: "wrong content type",
        body: JSON.stringify(good),
        status: 400,
        contentType: "text/plain",
        field: "content-type",
      },
      {
        name: "at the size limit (valid framing, still checked)",
        body: padTo(limit, { ...good, extra: 1 }),
        status: 400,
      },
      {
        name: "one byte past the size limit",
        body: padTo(limit + 1, good),
        status: 413,
        code: "payload_too_large",
      },
      { name: "no credential, bad body", body: { ...good, extra: true }, status: 401, noAuth: true },
    ] as const

  const routesWithBodies = [
    {
      path: "/v1/invites",
      limit: inviteBodyLimit,
      good: { email: "new-person@example.com", role: "member" },
      missing: "role",
      count: () => run(a.accounts.views.invites.keys(">")).then((k) => k.length),
    },
    {
      path: "/v1/keys",
      limit: keyBodyLimit,
      good: { name: "fresh", scope: "admin" },
      missing: "scope",
      count: () => run(a.accounts.views.keys.keys(">")).then((k) => k.length),
    },
  ]

  for (const r of routesWithBodies) {
    describe(`POST ${r.path}`, () => {
      it("a missing field is named", async () => {
        const before = await r.count()
        const { [r.missing as keyof typeof r.good]: _, ...rest } = r.good
        const res = await call(a, "POST", r.path, owner, rest)
        expect(res.status).toBe(400)
        expect(res.body).toEqual({ code: "invalid_request", error: `${r.missing}: is required` })
        expect(await r.count()).toBe(before)
      })
      for (const c of cases(r.limit, r.good)) {
        it(`${c.name} → ${c.status}`, async () => {
          const before = await r.count()
          const headers = "noAuth" in c ? {} : owner
          const contentType = "contentType" in c ? c.contentType : "application/json"
          const res = await call(a, "POST", r.path, headers, c.body as string | object, contentType)
          expect(res.status).toBe(c.status)
          if ("code" in c) expect(res.body.code).toBe(c.code)
          if ("field" in c) expect(res.body.error).toContain(c.field)
          expect(await r.count()).toBe(before)
        })
      }
    })
  }

  it("a run key without functions, and an admin key with a list, are refused naming functions", async () => {
    const before = (await run(a.accounts.views.keys.keys(">"))).length
    for (const body of [
      { name: "r", scope: "run" },
      { name: "r", scope: "admin", functions: ["fnc_00000000000000000000000000"] },
    ]) {
      const res = await call(a, "POST", "/v1/keys", owner, body)
      expect(res.status).toBe(400)
      expect(res.body.error).toMatch(/^functions: /)
    }
    expect((await run(a.accounts.views.keys.keys(">"))).length).toBe(before)
  })
})

describe("invites", () => {
  it("an invite lets that person join with its role; me shows it until accepted", async () => {
    const invited = await call(a, "POST", "/v1/invites", owner, {
      email: "Joiner@Example.com",
      role: "member",
    })
    expect(invited.status).toBe(201)
    expect(invited.body).toMatchObject({
      email: "joiner@example.com",
      account: account.id,
      account_name: "acme",
      role: "member",
    })
    expect(invited.body.expires_at - Math.floor(Date.parse(invited.body.created_at) / 1000)).toBe(
      7 * 24 * 3600,
    )
    const joiner = { authorization: `Bearer ${await personToken(keyFile, "joiner@example.com")}` }
    const me = await call(b, "GET", "/v1/me", joiner)
    expect(me.body.invites).toEqual([invited.body])
    expect(me.body.accounts).toEqual([])
    const accepted = await call(b, "POST", `/v1/invites/${account.id}/accept`, joiner)
    expect(accepted.status).toBe(200)
    expect(accepted.body).toMatchObject({
      account: account.id,
      email: "joiner@example.com",
      role: "member",
      user: me.body.user,
    })
    const after = await call(a, "GET", "/v1/me", joiner)
    expect(after.body.invites).toEqual([])
    expect(after.body.accounts).toEqual([
      { account: account.id, name: "acme", state: "active", role: "member" },
    ])
    expect((await call(a, "POST", `/v1/invites/${account.id}/accept`, joiner)).status).toBe(404)
    const again = await call(a, "POST", "/v1/invites", owner, { email: "joiner@example.com", role: "owner" })
    expect(again.status).toBe(400)
  })

  it("an expired invite is not listed, not shown, not accepted and not cancellable", async () => {
    const now = Math.floor(Date.now() / 1000)
    const base = {
      account: account.id,
      account_name: account.name,
      role: "member" as const,
      invited_by: account.owners[0]!,
      created_at: new Date((now - 8 * 24 * 3600) * 1000).toISOString(),
    }
    await run(a.accounts.putInvite({ ...base, email: "late@example.com", expires_at: now - 1 }))
    await run(a.accounts.putInvite({ ...base, email: "just-in-time@example.com", expires_at: now + 60 }))
    const listed = await call(a, "GET", "/v1/invites", owner)
    const emails = listed.body.invites.map((i: Json) => i.email)
    expect(emails).toContain("just-in-time@example.com")
    expect(emails).not.toContain("late@example.com")
    const late = { authorization: `Bearer ${await personToken(keyFile, "late@example.com")}` }
    expect((await call(a, "GET", "/v1/me", late)).body.invites).toEqual([])
    expect((await call(a, "POST", `/v1/invites/${account.id}/accept`, late)).status).toBe(404)
    expect((await call(a, "DELETE", "/v1/invites/late%40example.com", owner)).status).toBe(404)
    expect(await call(a, "DELETE", "/v1/invites/just-in-time%40example.com", owner)).toEqual({
      status: 200,
      body: { cancelled: "just-in-time@example.com" },
    })
    expect((await call(a, "DELETE", "/v1/invites/just-in-time%40example.com", owner)).status).toBe(404)
  })
})

describe("person routes answer from the watched caches, and their changes hold at once", () => {
  it("a member removed through gateway A is refused on their very next request on A and on B", async () => {
    const made = await run(a.accounts.createAccount("leaving", "stays@example.com"))
    const stays = {
      authorization: `Bearer ${await personToken(keyFile, "stays@example.com")}`,
      "service-account": made.account.id,
    }
    await run(a.accounts.invite(made.account, "goes@example.com", "member", made.owner.user))
    const goesUser = await run(a.accounts.ensureUser("goes@example.com"))
    await run(a.accounts.acceptInvite(made.account.id, goesUser))
    const goes = {
      authorization: `Bearer ${await personToken(keyFile, "goes@example.com")}`,
      "service-account": made.account.id,
    }
    // Both gateways have served the member twice: token, person, account and membership sit in
    // their caches, and the second request was answered from memory.
    for (const gw of [a, b, a, b]) expect((await call(gw, "GET", "/v1/members", goes)).status).toBe(200)
    const removed = await call(a, "DELETE", `/v1/members/${goesUser.user}`, stays)
    expect(removed).toEqual({ status: 200, body: { removed: goesUser.user } })
    for (const gw of [a, b])
      expect(await call(gw, "GET", "/v1/members", goes)).toEqual({
        status: 403,
        body: { error: expect.any(String), code: "not_a_member" },
      })
    expect((await call(b, "GET", "/v1/members", stays)).status).toBe(200)
  })

  it("an account suspended in the store refuses writes once the watch brings it, and keeps its reads", async () => {
    const made = await run(a.accounts.createAccount("freezing", "freezer@example.com"))
    const person = {
      authorization: `Bearer ${await personToken(keyFile, "freezer@example.com")}`,
      "service-account": made.account.id,
    }
    const key = await call(a, "POST", "/v1/keys", person, { name: "k", scope: "admin" })
    const bearer = { authorization: `Bearer ${key.body.token}` }
    for (let i = 0; i < 2; i++) {
      expect((await call(a, "GET", "/v1/members", person)).status).toBe(200)
      expect((await call(a, "GET", "/t/member", bearer)).status).toBe(200)
    }
    await run(a.accounts.setState(made.account.id, "suspended"))
    // Written by the store, not through a route, so no request waits for it: the watch brings it
    // to the cache as soon as NATS pushes it (under load, a moment later).
    let write = await call(a, "POST", "/v1/keys", person, { name: "k2", scope: "admin" })
    for (let i = 0; i < 100 && write.status !== 403; i++) {
      await new Promise((r) => setTimeout(r, 20))
      write = await call(a, "POST", "/v1/keys", person, { name: "k2", scope: "admin" })
    }
    expect(write).toEqual({ status: 403, body: { error: expect.any(String), code: "suspended" } })
    expect((await call(a, "GET", "/v1/members", person)).status).toBe(200)
    expect((await call(a, "GET", "/t/member", bearer)).status).toBe(200)
    const me = await call(a, "GET", "/v1/me", person)
    expect(me.body.accounts).toEqual([
      expect.objectContaining({ account: made.account.id, state: "suspended" }),
    ])
  })
})

describe("an account keeps one owner", () => {
  it("the only owner cannot be removed; with two, one can; the last one cannot again", async () => {
    const made = await run(a.accounts.createAccount("solo", "solo@example.com"))
    const solo = {
      authorization: `Bearer ${await personToken(keyFile, "solo@example.com")}`,
      "service-account": made.account.id,
    }
    const refused = await call(a, "DELETE", `/v1/members/${made.owner.user}`, solo)
    expect(refused.status).toBe(400)
    expect(refused.body.error).toMatch(/one owner/)
    await call(a, "POST", "/v1/invites", solo, { email: "second@example.com", role: "owner" })
    const second = { authorization: `Bearer ${await personToken(keyFile, "second@example.com")}` }
    const joined = await call(b, "POST", `/v1/invites/${made.account.id}/accept`, second)
    expect(joined.body.role).toBe("owner")
    const secondAsOwner = { ...second, "service-account": made.account.id }
    expect(await call(b, "DELETE", `/v1/members/${made.owner.user}`, secondAsOwner)).toEqual({
      status: 200,
      body: { removed: made.owner.user },
    })
    // Gateway A learns of the removal made through B when NATS pushes it to A's membership watch
    // (KeyCache: "as soon as NATS pushes the write"), a moment later under load.
    let seenByA = await call(a, "GET", "/v1/members", solo)
    for (let i = 0; i < 100 && seenByA.status === 200; i++) {
      await new Promise((r) => setTimeout(r, 20))
      seenByA = await call(a, "GET", "/v1/members", solo)
    }
    expect(seenByA.status).toBe(403)
    const last = await call(a, "DELETE", `/v1/members/${joined.body.user}`, secondAsOwner)
    expect(last.status).toBe(400)
    const members = await call(a, "GET", "/v1/members", secondAsOwner)
    expect(members.body.members.map((m: Json) => m.role)).toEqual(["owner"])
  })

  it("two owners removing each other at once: exactly one succeeds", async () => {
    const made = await run(a.accounts.createAccount("duel", "duel-1@example.com"))
    await run(a.accounts.invite(made.account, "duel-2@example.com", "owner", made.owner.user))
    const two = await run(
      a.accounts.acceptInvite(made.account.id, await run(a.accounts.ensureUser("duel-2@example.com"))),
    )
    const h = async (email: string) => ({
      authorization: `Bearer ${await personToken(keyFile, email)}`,
      "service-account": made.account.id,
    })
    const [r1, r2] = await Promise.all([
      call(a, "DELETE", `/v1/members/${two.user}`, await h("duel-1@example.com")),
      call(b, "DELETE", `/v1/members/${made.owner.user}`, await h("duel-2@example.com")),
    ])
    // The loser is refused by the one-owner rule (400), or, when the winner finished first, for
    // no longer being a member (403); never both removed.
    expect([r1.status, r2.status].filter((s) => s === 200)).toHaveLength(1)
    expect([r1.status, r2.status].filter((s) => s === 400 || s === 403)).toHaveLength(1)
    const left = await run(a.accounts.members(made.account.id))
    expect(left.map((m) => m.role)).toEqual(["owner"])
  })
})
