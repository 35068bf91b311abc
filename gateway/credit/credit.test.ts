/**
 * Buying credit over real HTTP: a gateway over a real nats-server with the Stripe-compatible fake
 * as its processor and the account actor's worker running, and a second gateway with no processor
 * configured (`503 purchases_closed`).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Layer, Option, Redacted, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { actorLayer } from "../../actors/account/Account.ts"
import type { AccountRecord } from "../../core/Accounts.ts"
import { balance } from "../../core/actors/AccountClient.ts"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import { ActorSettings } from "../../core/actors/Settings.ts"
import { eventually } from "../../core/actors/testing/Harness.ts"
import * as Worker from "../../core/actors/Worker.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as PaymentFake from "../../test/fakes/PaymentFake.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { personToken } from "../auth/testing.ts"
import { sealLayer } from "../functions/group.ts"
import { call, startGateway, type TestGateway } from "../logins/testing.ts"
import { PaymentSettings, parseSignatureHeader, layer as processorLayer, sign } from "./PaymentProcessor.ts"
import { purchaseEntryId, routes } from "./routes.ts"

let nats: StartedNatsServer
let dir: string
let fakeScope: Scope.CloseableScope
let fake: PaymentFake.PaymentFake
let gw: TestGateway
let closedGw: TestGateway
let account: AccountRecord
let owner: Record<string, string>
let member: Record<string, string>
let closedOwner: Record<string, string>
let callbackUrl: string

const creditServices = (settings: Partial<typeof PaymentSettings.defaults>, withWorker: boolean) => {
  const client = Layer.mergeAll(processorLayer, Mailbox.layer).pipe(
    Layer.provide(PaymentSettings.layer({ consoleUrl: "https://console.hangar.test", ...settings })),
    Layer.provideMerge(ActorSettings.layer({ partitions: 4 })),
  )
  if (!withWorker) return client
  // The account actor's worker in the same process, as `hangar serve all` runs it.
  const worker = actorLayer((a) => Worker.layer([a])).pipe(
    Layer.provide(sealLayer),
    Layer.provide(MasterKey.layerMemory()),
  )
  return Layer.merge(client, worker.pipe(Layer.provide(ActorSettings.layer({ partitions: 4 }))))
}

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-credit-"))
  const keyFile = join(dir, "issuer.key")
  fakeScope = Effect.runSync(Scope.make())
  fake = await Effect.runPromise(PaymentFake.make().pipe(Scope.extend(fakeScope)))
  gw = await startGateway(routes, {
    natsUrl: nats.url,
    prefix: uniquePrefix(),
    keyFile,
    services: creditServices(
      {
        baseUrl: fake.url,
        secretKey: Redacted.make(fake.secretKey),
        webhookSecret: Redacted.make(fake.webhookSecret),
      },
      true,
    ),
  })
  closedGw = await startGateway(routes, {
    natsUrl: nats.url,
    prefix: uniquePrefix(),
    keyFile,
    services: creditServices({}, false),
  })
  callbackUrl = `${gw.url}/v1/credit/callback`
  const made = await gw.run(gw.accounts.createAccount("acme", "owner@example.com"))
  account = made.account
  await gw.run(gw.accounts.invite(account, "member@example.com", "member", made.owner.user))
  await gw.run(
    gw.accounts.acceptInvite(account.id, await gw.run(gw.accounts.ensureUser("member@example.com"))),
  )
  const closedAccount = (await closedGw.run(closedGw.accounts.createAccount("shut", "owner@example.com")))
    .account
  const token = await personToken(keyFile, "owner@example.com")
  owner = { authorization: `Bearer ${token}`, "service-account": account.id }
  closedOwner = { authorization: `Bearer ${token}`, "service-account": closedAccount.id }
  member = {
    authorization: `Bearer ${await personToken(keyFile, "member@example.com")}`,
    "service-account": account.id,
  }
})

afterAll(async () => {
  await gw?.close()
  await closedGw?.close()
  if (fakeScope) await Effect.runPromise(Scope.close(fakeScope, Exit.void))
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

const checkout = (amount: unknown, headers = owner, g = gw) =>
  call(g, "POST", "/v1/credit/checkout", headers, { amount_usd_cents: amount })

const balanceNanos = () => gw.run(Effect.map(balance(account.id), (b) => b.balance_usd_nanos))

/** A checkout of `cents` through the gateway; answers the fake's session id. */
const newSession = async (cents: number) => {
  const res = await checkout(cents)
  expect(res.status).toBe(201)
  const id = /\/c\/pay\/(cs_test_[A-Za-z0-9_-]+)$/.exec(res.body.url)?.[1]
  expect(id).toBeDefined()
  return id!
}

describe("POST /v1/credit/checkout", () => {
  for (const [cents, ok] of [
    [499, false],
    [500, true],
    [50_000, true],
    [50_001, false],
    [1000.5, false],
    ["1000", false],
  ] as const) {
    it(`${JSON.stringify(cents)} cents → ${ok ? "201" : "400 naming amount_usd_cents"}`, async () => {
      const before = fake.requests.length
      const res = await checkout(cents)
      if (ok) {
        expect(res.status).toBe(201)
        expect(res.body).toEqual({
          url: expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+\/c\/pay\/cs_test_/),
        })
        expect(fake.requests.length).toBe(before + 1)
      } else {
        expect(res.status).toBe(400)
        expect(res.body.code).toBe("invalid_request")
        expect(res.body.error).toContain("amount_usd_cents")
        expect(fake.requests.length).toBe(before)
      }
    })
  }

  it("sends Stripe's form-encoded session create with the secret key, and the fake made that session", async () => {
    const res = await checkout(1234)
    const request = fake.requests.at(-1)!
    expect(request.method).toBe("POST")
    expect(request.path).toBe("/v1/checkout/sessions")
    expect(request.headers.authorization).toBe(`Bearer ${fake.secretKey}`)
    const form = new URLSearchParams(request.body)
    expect(form.get("mode")).toBe("payment")
    expect(form.get("line_items[0][price_data][unit_amount]")).toBe("1234")
    expect(form.get("line_items[0][price_data][currency]")).toBe("usd")
    expect(form.get("metadata[account]")).toBe(account.id)
    expect(form.get("success_url")).toBe("https://console.hangar.test/credit?checkout=success")
    const session = [...fake.sessions.values()].find((s) => s.url === res.body.url)
    expect(session).toMatchObject({ amount_total: 1234, currency: "usd", metadata: { account: account.id } })
  })

  it("is for owners only", async () => {
    expect((await checkout(500, member)).body.code).toBe("owners_only")
  })

  it("with no processor configured → 503 purchases_closed (after the amount is checked)", async () => {
    const res = await checkout(500, closedOwner, closedGw)
    expect(res.status).toBe(503)
    expect(res.body.code).toBe("purchases_closed")
    expect((await checkout(499, closedOwner, closedGw)).status).toBe(400)
  })

  it("a processor that refuses the key → 500 internal, and the key is not logged", async () => {
    fake.failNext(1, {
      status: 401,
      json: { error: { type: "invalid_request_error", message: "Invalid API Key" } },
    })
    const res = await checkout(500)
    expect(res.status).toBe(500)
    expect(res.body.code).toBe("internal")
    expect(gw.lines.join("\n")).not.toContain(fake.secretKey)
  })
})

describe("POST /v1/credit/callback", () => {
  it("signature headers parse as Stripe writes them", () => {
    const v = sign("whsec_x", 1700000000, "{}")
    expect(parseSignatureHeader(`t=1700000000,v1=${v},v0=abc`)).toEqual({ t: 1700000000, v1: [v] })
    expect(parseSignatureHeader("v1=abc")).toBeUndefined()
    expect(parseSignatureHeader("t=1,v1=nothex")).toBeUndefined()
  })

  it("a verified completed checkout credits the account once, however often it is delivered", async () => {
    const start = await balanceNanos()
    const session = await newSession(2500)
    const payload = fake.completedEvent(session)
    const first = await fake.deliver(callbackUrl, payload)
    expect(first).toMatchObject({ status: 200, body: { received: true, credited: true } })
    // Stripe retries with a fresh signature and timestamp; a second event id for the same session too.
    const again = await fake.deliver(callbackUrl, payload, { t: Math.floor(Date.now() / 1000) - 60 })
    expect(again.status).toBe(200)
    const other = await fake.deliver(callbackUrl, fake.completedEvent(session))
    expect(other.status).toBe(200)
    const expected = start + 2500 * 10_000_000
    await gw.run(
      eventually(
        Effect.map(balance(account.id), (b) =>
          b.balance_usd_nanos === expected ? Option.some(b) : Option.none(),
        ),
        "20 seconds",
        "the purchase on the balance",
      ),
    )
    // A later, unrelated purchase lands after the repeats, so they have all been handled by then.
    const later = await newSession(500)
    expect((await fake.complete(callbackUrl, later)).status).toBe(200)
    await gw.run(
      eventually(
        Effect.map(balance(account.id), (b) =>
          b.balance_usd_nanos === expected + 500 * 10_000_000 ? Option.some(b) : Option.none(),
        ),
        "20 seconds",
        "the second purchase",
      ),
    )
    expect(purchaseEntryId(session)).toMatch(/^led_[0-9a-hjkmnp-tv-z]{26}$/)
    expect(purchaseEntryId(session)).toBe(purchaseEntryId(session))
  })

  const refused = async (
    options: { t?: number; secret?: string; signature?: string },
    expectCode: string,
  ) => {
    const session = await newSession(700)
    const start = await balanceNanos()
    const res = await fake.deliver(callbackUrl, fake.completedEvent(session), options)
    expect(res.status).toBe(400)
    expect((res.body as { code: string }).code).toBe(expectCode)
    // A control purchase afterwards shows the refused one never reached the balance.
    const control = await newSession(500)
    await fake.complete(callbackUrl, control)
    await gw.run(
      eventually(
        Effect.map(balance(account.id), (b) =>
          b.balance_usd_nanos > start ? Option.some(b) : Option.none(),
        ),
      ),
    )
    expect(await balanceNanos()).toBe(start + 500 * 10_000_000)
  }

  it("signed with another secret → 400 invalid_signature, nothing credited", () =>
    refused({ secret: "whsec_wrong" }, "invalid_signature"))
  it("without a signature → 400 invalid_signature", () => refused({ signature: "" }, "invalid_signature"))
  it("a timestamp 301 s old → 400 invalid_signature", () =>
    refused({ t: Math.floor(Date.now() / 1000) - 301 }, "invalid_signature"))
  // Rounded up: rounded down it is only 300.0–301 s ahead, and the time the request takes to
  // arrive can bring it within the 300 s tolerance.
  it("a timestamp 301 s ahead → 400 invalid_signature", () =>
    refused({ t: Math.ceil(Date.now() / 1000) + 301 }, "invalid_signature"))

  it("a timestamp 290 s old still verifies", async () => {
    const session = await newSession(500)
    const res = await fake.deliver(callbackUrl, fake.completedEvent(session), {
      t: Math.floor(Date.now() / 1000) - 290,
    })
    expect(res.status).toBe(200)
  })

  it("a payload changed after signing → 400 invalid_signature", async () => {
    const session = await newSession(500)
    const payload = fake.completedEvent(session)
    const signature = fake.signatureOf(payload)
    const res = await fake.deliver(
      callbackUrl,
      payload.replace('"amount_total":500', '"amount_total":50000'),
      {
        signature,
      },
    )
    expect(res.status).toBe(400)
    expect((res.body as { code: string }).code).toBe("invalid_signature")
  })

  it("an event that is not a paid checkout is acknowledged and credits nothing", async () => {
    const payload = JSON.stringify({
      id: "evt_test_other",
      type: "payment_intent.created",
      created: Math.floor(Date.now() / 1000),
      data: { object: { id: "pi_test_1" } },
    })
    const res = await fake.deliver(callbackUrl, payload)
    expect(res).toMatchObject({ status: 200, body: { received: true, credited: false } })
  })

  it("with no processor configured → 503 purchases_closed", async () => {
    const res = await fake.deliver(`${closedGw.url}/v1/credit/callback`, "{}")
    expect(res.status).toBe(503)
    expect((res.body as { code: string }).code).toBe("purchases_closed")
  })
})
