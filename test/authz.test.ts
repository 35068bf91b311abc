/**
 * The authorization matrix: every route × every kind of caller → the spec's status and code,
 * through real HTTP against a gateway on port 0 over a real nats-server.
 *
 * The matrix is data (`matrix` below). Another route group joins by adding its routes to
 * `served` and one row per route; a row that changes something gives `prepare`, which makes a
 * fresh target per cell so cells do not depend on each other's order.
 */

import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Layer, Redacted } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AccountWorker, startAccountWorker } from "../actors/account/testing.ts"
import type { AccountRecord, AccountsService } from "../core/Accounts.ts"
import * as Mailbox from "../core/actors/Mailbox.ts"
import { ActorSettings } from "../core/actors/Settings.ts"
import * as Functions from "../core/Functions.ts"
import { makeId } from "../core/Ids.ts"
import * as Keyring from "../core/Keyring.ts"
import { hashToken, newToken } from "../core/KeyTokens.ts"
import * as Links from "../core/Links.ts"
import * as MasterKey from "../core/MasterKey.ts"
import * as Providers from "../core/Providers.ts"
import * as SealStream from "../core/SealStream.ts"
import * as Uploads from "../core/Uploads.ts"
import * as WrappedKeyStore from "../core/WrappedKeyStore.ts"
import { routes as accountRoutes } from "../gateway/accounts/routes.ts"
import { authRoute } from "../gateway/auth/Route.ts"
import { personToken, run, startGateway, type TestGateway } from "../gateway/auth/testing.ts"
import { CommandRouteSettings } from "../gateway/commands/LongPoll.ts"
import * as Commands from "../gateway/commands/routes.ts"
import * as PaymentProcessor from "../gateway/credit/PaymentProcessor.ts"
import { routes as creditRoutes } from "../gateway/credit/routes.ts"
import * as Downloads from "../gateway/downloads/routes.ts"
import * as CliLogins from "../gateway/logins/CliLogins.ts"
import { routes as loginRoutes } from "../gateway/logins/routes.ts"
import { routeServices } from "../gateway/logins/testing.ts"
import { json } from "../gateway/Response.ts"
import { RunRouteSettings } from "../gateway/runs/Runs.ts"
import * as Runs from "../gateway/runs/routes.ts"
import type { Key } from "../schema/Account.ts"
import type { ErrorCode } from "../schema/Errors.ts"
import type { KeyId } from "../schema/Ids.ts"
import { type StartedNatsServer, startNatsServer } from "./harness/NatsServer.ts"
import { uniquePrefix } from "./harness/names.ts"

// Probe routes for the labels no route of this group uses yet (`anyone`, `member`,
// `member (admin keys)`), so those labels are in the matrix before their real routes exist.
const probes = [
  authRoute({
    method: "GET",
    path: "/t/anyone",
    access: "anyone",
    handler: () => Effect.succeed(json({ ok: 1 })),
  }),
  authRoute({
    method: "GET",
    path: "/t/member",
    access: "member",
    handler: ({ principal }) => Effect.succeed(json({ who: principal._tag, account: principal.account.id })),
  }),
  authRoute({
    method: "POST",
    path: "/t/admin-keys",
    access: "member (admin keys)",
    handler: ({ principal }) => Effect.succeed(json({ who: principal._tag }, { status: 201 })),
  }),
]

// The login and credit groups' services (no payment processor configured) are given to their
// routes directly, since this gateway provides only auth and the account store.
const groupRoutes = [...loginRoutes, ...creditRoutes, ...Runs.routes, ...Downloads.routes, ...Commands.routes]
// The runs and downloads groups: the stores they read, links, sealing with an in-memory master key.
const runServices = Layer.mergeAll(
  Runs.layer,
  RunRouteSettings.layer(),
  Downloads.layer,
  Functions.layer,
  Providers.layer,
  Uploads.layer,
  Links.layer.pipe(
    Layer.provideMerge(Links.LinkSettings.layer({ key: Redacted.make(randomBytes(32).toString("base64")) })),
  ),
  SealStream.layer.pipe(
    Layer.provide(Keyring.layer),
    Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
  ),
)
const groupServices = Layer.mergeAll(
  runServices,
  CommandRouteSettings.layer(),
  CliLogins.layer.pipe(Layer.provideMerge(CliLogins.CliLoginSettings.layer())),
  PaymentProcessor.layer.pipe(Layer.provide(PaymentProcessor.PaymentSettings.layer())),
  Mailbox.layer.pipe(Layer.provide(ActorSettings.layer())),
)
let groups: Awaited<ReturnType<typeof routeServices>> | undefined
let accountWorker: AccountWorker | undefined

const served = [...accountRoutes, ...probes, ...groupRoutes]

/** The kinds of caller, in matrix column order. */
const callers = [
  "none",
  "malformed",
  "unknownKey",
  "revokedKey",
  "runKey",
  "adminKey",
  "owner",
  "member",
  "nonMember",
  "noAccountHeader",
] as const
type Caller = (typeof callers)[number]

type Outcome = number | readonly [number, ErrorCode]
const U = [401, "unauthenticated"] as const
const PO = [403, "people_only"] as const
const KS = [403, "key_scope"] as const
const NM = [403, "not_a_member"] as const
const OO = [403, "owners_only"] as const
const AR = [400, "account_required"] as const
const NF = [404, "not_found"] as const

interface Fixture {
  readonly account: AccountRecord
  readonly accounts: AccountsService
  readonly ownerUser: string
  readonly headers: Record<Caller, Record<string, string>>
}

interface Target {
  readonly path: string
  readonly body?: unknown
}

interface Row {
  readonly method: "GET" | "POST" | "DELETE"
  readonly route: string
  readonly prepare?: (f: Fixture) => Promise<Target>
  readonly expect: Record<Caller, Outcome>
}

const unauthenticatedFour = { none: U, malformed: U, unknownKey: U, revokedKey: U } as const
const ownerOnly = (ok: number) =>
  ({
    ...unauthenticatedFour,
    runKey: PO,
    adminKey: PO,
    owner: ok,
    member: OO,
    nonMember: NM,
    noAccountHeader: AR,
  }) as const
const personOnly = {
  ...unauthenticatedFour,
  runKey: PO,
  adminKey: PO,
  owner: 200,
  member: 200,
  nonMember: NM,
  noAccountHeader: AR,
} as const

/** The same outcome for every caller (routes open to anyone). */
const everyone = (outcome: Outcome): Record<Caller, Outcome> =>
  Object.fromEntries(callers.map((c) => [c, outcome])) as Record<Caller, Outcome>

/** A fresh pending CLI login (a new key hash each time). */
const freshLogin = async (): Promise<{ id: string; code: string }> => {
  const res = await fetch(`${gateway.url}/v1/cli-logins`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ name: "laptop", key_hash: hashToken(newToken()) }),
  })
  return (await res.json()) as { id: string; code: string }
}

const freshEmail = () => `${makeId("usr").slice(4, 16)}@example.com`

/** A fresh member of the fixture account (target of `DELETE /v1/members/{user}`). */
const freshMember = async (f: Fixture): Promise<string> => {
  const email = freshEmail()
  await run(f.accounts.invite(f.account, email, "member", f.ownerUser))
  const user = await run(f.accounts.ensureUser(email))
  return (await run(f.accounts.acceptInvite(f.account.id, user))).user
}

/** A fresh admin key of the fixture account; returns its id and token. */
const freshKey = async (
  f: Pick<Fixture, "accounts" | "ownerUser">,
  account: string,
  scope: "admin" | "run" = "admin",
): Promise<{ id: string; token: string }> => {
  const token = newToken()
  const key: Key = {
    id: makeId("key") as KeyId,
    account: account as Key["account"],
    name: "fixture",
    scope,
    functions: ["*"],
    created_at: new Date().toISOString(),
    created_by: f.ownerUser as Key["created_by"],
  }
  await run(f.accounts.createKey(key, hashToken(token)))
  return { id: key.id, token }
}

/** A `member` route: keys of both scopes and members pass with `ok`. */
const memberRoute = (ok: Outcome): Record<Caller, Outcome> => ({
  ...unauthenticatedFour,
  runKey: ok,
  adminKey: ok,
  owner: ok,
  member: ok,
  nonMember: NM,
  noAccountHeader: AR,
})

/** The matrix: one row per route, one outcome per caller. */
const matrix: ReadonlyArray<Row> = [
  {
    method: "POST",
    route: "/v1/functions/{id}/runs",
    // No function in this account: every caller allowed to try reaches the lookup.
    prepare: async () => ({
      path: "/v1/functions/fnc_00000000000000000000000000/runs",
      body: { prompt: "go" },
    }),
    expect: { ...memberRoute(NF), runKey: NF },
  },
  // A run key must name the function it lists runs of.
  { method: "GET", route: "/v1/runs", expect: { ...memberRoute(200), runKey: [400, "invalid_request"] } },
  {
    method: "GET",
    route: "/v1/runs/{id}",
    prepare: async () => ({ path: "/v1/runs/run_00000000000000000000000000" }),
    expect: { ...memberRoute(NF), runKey: NF },
  },
  {
    method: "GET",
    route: "/v1/runs/{id}/log",
    prepare: async () => ({ path: "/v1/runs/run_00000000000000000000000000/log" }),
    expect: { ...memberRoute(NF), runKey: NF },
  },
  // Commands: no run in this account, so every caller allowed to try reaches the run lookup.
  ...(
    [
      ["POST", "/v1/runs/{id}/commands", { kind: "bash", arguments: { command: "true" } }],
      ["GET", "/v1/runs/{id}/commands", undefined],
      ["GET", "/v1/runs/{id}/commands/{cid}", undefined],
      ["GET", "/v1/runs/{id}/commands/{cid}/output", undefined],
      ["POST", "/v1/runs/{id}/commands/{cid}/cancel", undefined],
    ] as const
  ).map(
    ([method, route, body]): Row => ({
      method,
      route,
      prepare: async () => ({
        path: route
          .replace("{id}", "run_00000000000000000000000000")
          .replace("{cid}", "cmd_00000000000000000000000000"),
        ...(body === undefined ? {} : { body }),
      }),
      expect: memberRoute(NF),
    }),
  ),
  // The signature is the credential: without one every caller is refused alike.
  {
    method: "GET",
    route: "/v1/downloads/{store}/{object}",
    prepare: async () => ({ path: "/v1/downloads/outputs/run_00000000000000000000000000" }),
    expect: everyone(U),
  },
  {
    method: "GET",
    route: "/v1/me",
    expect: {
      ...unauthenticatedFour,
      runKey: PO,
      adminKey: PO,
      owner: 200,
      member: 200,
      nonMember: 200,
      noAccountHeader: 200,
    },
  },
  {
    method: "POST",
    route: "/v1/invites/{invite}/accept",
    prepare: async (f) => ({ path: `/v1/invites/${f.account.id}/accept` }),
    // Signed in is enough to try; without an invite for the caller's e-mail there is nothing to accept.
    expect: {
      ...unauthenticatedFour,
      runKey: PO,
      adminKey: PO,
      owner: NF,
      member: NF,
      nonMember: NF,
      noAccountHeader: NF,
    },
  },
  { method: "GET", route: "/v1/account", expect: personOnly },
  { method: "GET", route: "/v1/members", expect: personOnly },
  { method: "GET", route: "/v1/usage", expect: personOnly },
  {
    method: "GET",
    route: "/v1/webhooks/public-key",
    expect: {
      ...unauthenticatedFour,
      runKey: 200,
      adminKey: 200,
      owner: 200,
      member: 200,
      nonMember: NM,
      noAccountHeader: AR,
    },
  },
  {
    method: "DELETE",
    route: "/v1/members/{user}",
    prepare: async (f) => ({ path: `/v1/members/${await freshMember(f)}` }),
    expect: ownerOnly(200),
  },
  { method: "GET", route: "/v1/invites", expect: ownerOnly(200) },
  {
    method: "POST",
    route: "/v1/invites",
    prepare: async () => ({ path: "/v1/invites", body: { email: freshEmail(), role: "member" } }),
    expect: ownerOnly(201),
  },
  {
    method: "DELETE",
    route: "/v1/invites/{invite}",
    prepare: async (f) => {
      const email = freshEmail()
      await run(f.accounts.invite(f.account, email, "member", f.ownerUser))
      return { path: `/v1/invites/${encodeURIComponent(email)}` }
    },
    expect: ownerOnly(200),
  },
  { method: "GET", route: "/v1/keys", expect: ownerOnly(200) },
  {
    method: "POST",
    route: "/v1/keys",
    prepare: async () => ({ path: "/v1/keys", body: { name: "ci", scope: "run", functions: ["*"] } }),
    expect: ownerOnly(201),
  },
  {
    method: "DELETE",
    route: "/v1/keys/{id}",
    prepare: async (f) => ({ path: `/v1/keys/${(await freshKey(f, f.account.id)).id}` }),
    expect: ownerOnly(200),
  },
  {
    method: "POST",
    route: "/v1/cli-logins",
    prepare: async () => ({
      path: "/v1/cli-logins",
      body: { name: "laptop", key_hash: hashToken(newToken()) },
    }),
    expect: everyone(201),
  },
  {
    method: "GET",
    route: "/v1/cli-logins/{id}",
    prepare: async () => ({ path: `/v1/cli-logins/${(await freshLogin()).id}` }),
    expect: everyone(200),
  },
  {
    method: "POST",
    route: "/v1/cli-logins/{id}/approve",
    prepare: async () => {
      const login = await freshLogin()
      return { path: `/v1/cli-logins/${login.id}/approve`, body: { code: login.code } }
    },
    expect: ownerOnly(200),
  },
  {
    method: "POST",
    route: "/v1/credit/checkout",
    prepare: async () => ({ path: "/v1/credit/checkout", body: { amount_usd_cents: 500 } }),
    // No processor is configured here; the owner gets as far as that.
    expect: { ...ownerOnly(0), owner: [503, "purchases_closed"] },
  },
  // The processor calls this with its signature, not a credential; with none configured it is closed.
  { method: "POST", route: "/v1/credit/callback", expect: everyone([503, "purchases_closed"]) },
  {
    method: "GET",
    route: "/t/anyone",
    expect: {
      none: 200,
      malformed: 200,
      unknownKey: 200,
      revokedKey: 200,
      runKey: 200,
      adminKey: 200,
      owner: 200,
      member: 200,
      nonMember: 200,
      noAccountHeader: 200,
    },
  },
  {
    method: "GET",
    route: "/t/member",
    expect: {
      ...unauthenticatedFour,
      runKey: 200,
      adminKey: 200,
      owner: 200,
      member: 200,
      nonMember: NM,
      noAccountHeader: AR,
    },
  },
  {
    method: "POST",
    route: "/t/admin-keys",
    expect: {
      ...unauthenticatedFour,
      runKey: KS,
      adminKey: 201,
      owner: 201,
      member: 201,
      nonMember: NM,
      noAccountHeader: AR,
    },
  },
]

let nats: StartedNatsServer
let dir: string
let keyFile: string
let gateway: TestGateway
let fixture: Fixture

const call = (method: string, path: string, headers: Record<string, string>, body?: unknown) =>
  fetch(`${gateway.url}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-authz-"))
  keyFile = join(dir, "issuer.key")
  const prefix = uniquePrefix()
  groups = await routeServices(groupServices, { natsUrl: nats.url, prefix })
  // The account actor answers balances and webhook keys (GET /v1/account, /v1/usage, /v1/webhooks/…).
  accountWorker = await Effect.runPromise(startAccountWorker(nats.url, prefix))
  gateway = await startGateway([...accountRoutes, ...probes, ...groups.provide(groupRoutes)], {
    natsUrl: nats.url,
    prefix,
    keyFile,
  })
  const accounts = gateway.accounts
  const { account, owner } = await run(accounts.createAccount("acme", "owner@example.com"))
  const f = { accounts, ownerUser: owner.user }
  await run(accounts.invite(account, "member@example.com", "member", owner.user))
  await run(accounts.acceptInvite(account.id, await run(accounts.ensureUser("member@example.com"))))
  // The non-member belongs to another account, so "member of something" is not enough.
  await run(accounts.createAccount("other", "stranger@example.com"))
  const admin = await freshKey(f, account.id, "admin")
  const runKey = await freshKey(f, account.id, "run")
  const revoked = await freshKey(f, account.id, "admin")
  await run(accounts.revokeKey(account.id, revoked.id, owner.user))
  const sa = { "service-account": account.id }
  const bearer = (t: string) => ({ authorization: `Bearer ${t}` })
  fixture = {
    account,
    accounts,
    ownerUser: owner.user,
    headers: {
      none: {},
      malformed: { authorization: "Token abc", ...sa },
      unknownKey: { ...bearer(newToken()), ...sa },
      revokedKey: { ...bearer(revoked.token), ...sa },
      runKey: bearer(runKey.token),
      adminKey: bearer(admin.token),
      owner: { ...bearer(await personToken(keyFile, "owner@example.com")), ...sa },
      member: { ...bearer(await personToken(keyFile, "member@example.com")), ...sa },
      nonMember: { ...bearer(await personToken(keyFile, "stranger@example.com")), ...sa },
      noAccountHeader: bearer(await personToken(keyFile, "owner@example.com")),
    },
  }
})

afterAll(async () => {
  await gateway?.close()
  await groups?.close()
  if (accountWorker) await Effect.runPromise(accountWorker.stop)
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("authorization matrix", () => {
  it("covers every route served", () => {
    const rows = new Set(matrix.map((r) => `${r.method} ${r.route.replace(/\{(\w+)\}/g, ":$1")}`))
    expect(new Set(served.map((r) => `${r.method} ${r.path}`))).toEqual(rows)
  })

  for (const row of matrix) {
    describe(`${row.method} ${row.route}`, () => {
      for (const caller of callers) {
        const outcome = row.expect[caller]
        const [status, code] = typeof outcome === "number" ? [outcome, undefined] : outcome
        it(`${caller} → ${status}${code ? ` ${code}` : ""}`, async () => {
          const target = row.prepare ? await row.prepare(fixture) : { path: row.route }
          const res = await call(row.method, target.path, fixture.headers[caller], target.body)
          const body = (await res.json()) as { code?: string }
          // Only error bodies carry an error `code` (a CLI login's answer has its own `code` field).
          expect({ status: res.status, code: res.status >= 400 ? body.code : undefined }).toEqual({
            status,
            code,
          })
        })
      }
    })
  }
})

describe("malformed credentials", () => {
  for (const authorization of [
    "Bearer",
    "Bearer ",
    "Bearer hgr_short",
    `Bearer ${newToken()}x`,
    "Bearer eyJhbGciOiJFZERTQSJ9.e30.sig",
    "bearer  two spaces",
    "Basic dXNlcjpwYXNz",
  ]) {
    it(`${JSON.stringify(authorization)} → 401 unauthenticated`, async () => {
      const res = await call("GET", "/v1/me", { authorization })
      expect(res.status).toBe(401)
      expect(((await res.json()) as { code: string }).code).toBe("unauthenticated")
    })
  }

  it("an expired ID token → 401", async () => {
    const token = await personToken(keyFile, "owner@example.com", { ttlSeconds: -120 })
    const res = await call("GET", "/v1/me", { authorization: `Bearer ${token}` })
    expect(res.status).toBe(401)
  })

  it("an ID token for another audience → 401", async () => {
    const token = await personToken(keyFile, "owner@example.com", { audience: "someone-else" })
    const res = await call("GET", "/v1/me", { authorization: `Bearer ${token}` })
    expect(res.status).toBe(401)
  })

  it("an ID token signed by another issuer key → 401", async () => {
    const other = join(dir, "other-issuer.key")
    const token = await personToken(other, "owner@example.com")
    const res = await call("GET", "/v1/me", { authorization: `Bearer ${token}` })
    expect(res.status).toBe(401)
  })

  it("a key naming another account in Service-Account → 403 not_a_member", async () => {
    const res = await call("GET", "/t/member", {
      ...fixture.headers.adminKey,
      "service-account": makeId("acc"),
    })
    expect(res.status).toBe(403)
    expect(((await res.json()) as { code: string }).code).toBe("not_a_member")
  })

  it("a malformed Service-Account → 403 not_a_member", async () => {
    const res = await call("GET", "/v1/account", {
      ...fixture.headers.noAccountHeader,
      "service-account": "*",
    })
    expect(res.status).toBe(403)
  })
})

describe("a suspended account", () => {
  interface Suspended {
    owner: Record<string, string>
    admin: Record<string, string>
    account: AccountRecord
    ownerUser: string
  }
  let s: Suspended

  beforeAll(async () => {
    const accounts = fixture.accounts
    const { account, owner } = await run(accounts.createAccount("frozen", "frozen-owner@example.com"))
    const admin = await freshKey({ accounts, ownerUser: owner.user }, account.id, "admin")
    await run(accounts.setState(account.id, "suspended"))
    s = {
      account,
      ownerUser: owner.user,
      owner: {
        authorization: `Bearer ${await personToken(keyFile, "frozen-owner@example.com")}`,
        "service-account": account.id,
      },
      admin: { authorization: `Bearer ${admin.token}` },
    }
  })

  const cases: ReadonlyArray<{
    readonly name: string
    readonly method: string
    readonly who: "owner" | "admin"
    readonly path: (s: Suspended) => Promise<string> | string
    readonly body?: unknown
    readonly expect: Outcome
  }> = [
    { name: "reads its account", method: "GET", who: "owner", path: () => "/v1/account", expect: 200 },
    { name: "reads members", method: "GET", who: "owner", path: () => "/v1/members", expect: 200 },
    { name: "reads keys", method: "GET", who: "owner", path: () => "/v1/keys", expect: 200 },
    { name: "reads invites", method: "GET", who: "owner", path: () => "/v1/invites", expect: 200 },
    {
      name: "cannot create keys",
      method: "POST",
      who: "owner",
      path: () => "/v1/keys",
      body: { name: "x", scope: "admin" },
      expect: [403, "suspended"],
    },
    {
      name: "cannot invite",
      method: "POST",
      who: "owner",
      path: () => "/v1/invites",
      body: { email: "new@example.com", role: "member" },
      expect: [403, "suspended"],
    },
    {
      name: "can revoke keys",
      method: "DELETE",
      who: "owner",
      path: async (x) =>
        `/v1/keys/${(await freshKey({ accounts: fixture.accounts, ownerUser: x.ownerUser }, x.account.id)).id}`,
      expect: 200,
    },
    { name: "its keys still read", method: "GET", who: "admin", path: () => "/t/member", expect: 200 },
    {
      name: "its keys cannot write",
      method: "POST",
      who: "admin",
      path: () => "/t/admin-keys",
      expect: [403, "suspended"],
    },
  ]

  for (const c of cases) {
    it(`${c.name}: ${c.method} → ${JSON.stringify(c.expect)}`, async () => {
      const res = await call(c.method, await c.path(s), s[c.who], c.body)
      const body = (await res.json()) as { code?: string }
      const [status, code] = typeof c.expect === "number" ? [c.expect, undefined] : c.expect
      expect({ status: res.status, code: body.code }).toEqual({ status, code })
    })
  }

  it("an invite to it cannot be accepted (403 suspended) and stays", async () => {
    await run(
      fixture.accounts.putInvite({
        email: "joiner@example.com",
        account: s.account.id,
        account_name: s.account.name,
        role: "member",
        invited_by: s.ownerUser as Key["created_by"],
        created_at: new Date().toISOString(),
        expires_at: Math.floor(Date.now() / 1000) + 3600,
      }),
    )
    const token = await personToken(keyFile, "joiner@example.com")
    const res = await call("POST", `/v1/invites/${s.account.id}/accept`, { authorization: `Bearer ${token}` })
    expect(res.status).toBe(403)
    expect(((await res.json()) as { code: string }).code).toBe("suspended")
    expect((await run(fixture.accounts.invites(s.account.id))).map((i) => i.email)).toEqual([
      "joiner@example.com",
    ])
  })

  it("me lists it as suspended", async () => {
    const res = await call("GET", "/v1/me", { authorization: s.owner.authorization! })
    const me = (await res.json()) as { accounts: Array<{ account: string; state: string }> }
    expect(me.accounts).toEqual([expect.objectContaining({ account: s.account.id, state: "suspended" })])
  })
})
