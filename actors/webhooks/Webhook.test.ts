/**
 * The webhook actor on a real nats-server and a real worker (with the account actor, which holds
 * the signing key), delivering to a real HTTPS receiver on loopback whose self-signed certificate
 * (made by `openssl` in a temp dir) is trusted through `caFile`. Loopback is reachable only with
 * `allowPrivateTargets`; the refusal tests leave it off and count the receiver's TCP connections.
 *
 * Signatures are checked by an independent verifier (node:crypto over the `whpk_` key the account
 * actor hands out), not by `Signing.ts`.
 */
import { execFileSync } from "node:child_process"
import { createPublicKey, createSecretKey, randomBytes, verify } from "node:crypto"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { createServer, type Server } from "node:https"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Option, Scope } from "effect"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import { ActorSettings, type ActorSettingsShape } from "../../core/actors/Settings.ts"
import * as State from "../../core/actors/State.ts"
import { eventually, fast, startWorker } from "../../core/actors/testing/Harness.ts"
import { makeId } from "../../core/Ids.ts"
import * as Kv from "../../core/Kv.ts"
import * as Links from "../../core/Links.ts"
import { Nats, layerUrl as natsLayerUrl } from "../../core/Nats.ts"
import { Seal } from "../../core/Seal.ts"
import { Storage, layerPrefix as storageLayerPrefix } from "../../core/Storage.ts"
import { Account, type WebhookKeyReply } from "../../schema/actors/Account.ts"
import { type Deliver, Webhook, type WebhookState } from "../../schema/actors/Webhook.ts"
import { timestamp } from "../../schema/Common.ts"
import type { AccountId, EventId, RunId } from "../../schema/Ids.ts"
import { apiRun, emptyUsage, StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import * as AccountActor from "../account/Account.ts"
import { sealLayerMemory } from "../account/testing.ts"
import { WebhookSettings, type WebhookSettingsShape } from "./Settings.ts"
import * as WebhookActor from "./Webhook.ts"

// --- the receiver ---------------------------------------------------------------------------

interface Received {
  readonly path: string
  readonly headers: Record<string, string>
  readonly body: string
}

let server: StartedNatsServer
let certDir: string
let receiver: Server
let port: number
let caFile: string
let connections = 0
const received: Array<Received> = []
const flakyCounts = new Map<string, number>()

const requestsTo = (path: string) => received.filter((r) => r.path === path)

beforeAll(async () => {
  server = await startNatsServer()
  certDir = mkdtempSync(join(tmpdir(), "hangar-webhook-test-"))
  caFile = join(certDir, "cert.pem")
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      join(certDir, "key.pem"),
      "-out",
      caFile,
      "-days",
      "2",
      "-subj",
      "/CN=localhost",
      "-addext",
      "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1",
    ],
    { stdio: "ignore" },
  )
  receiver = createServer(
    { key: readFileSync(join(certDir, "key.pem")), cert: readFileSync(caFile) },
    (req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        const path = req.url ?? ""
        received.push({
          path,
          headers: Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, String(v)])),
          body: Buffer.concat(chunks).toString("utf8"),
        })
        if (path.startsWith("/flaky/")) {
          // Fails twice, then succeeds (per path, so each test has its own count).
          const n = (flakyCounts.get(path) ?? 0) + 1
          flakyCounts.set(path, n)
          res.writeHead(n <= 2 ? 503 : 204).end()
        } else if (path.startsWith("/redirect/")) {
          res.writeHead(302, { location: `/ok/followed${path}` }).end()
        } else if (path.startsWith("/silent/")) {
          // Never answers; the client's timeout ends the exchange.
        } else {
          res.writeHead(200, { "content-type": "text/plain" }).end("ok")
        }
      })
    },
  )
  receiver.on("connection", () => {
    connections++
  })
  // Dual stack: 127.0.0.1, ::1 and ::ffff:127.0.0.1 all reach it (and would be counted).
  await new Promise<void>((resolve) => receiver.listen(0, "::", resolve))
  port = (receiver.address() as AddressInfo).port
})

afterAll(async () => {
  receiver?.closeAllConnections()
  await new Promise<void>((resolve) => (receiver ? receiver.close(() => resolve()) : resolve()))
  if (certDir) rmSync(certDir, { recursive: true, force: true })
  await server?.stop()
})

// --- a worker with the account and webhook actors -------------------------------------------------

const links = Links.fromKey(createSecretKey(randomBytes(32)), { base: "https://hangar.test" })

type Env = Mailbox.Mailbox | Nats | Storage

/** Runs `body` with a worker hosting the account and webhook actors (with `settings`) and a client. */
// The harness's fast settings, with leases that outlast a loaded machine's pauses: these tests count
// the requests a receiver got, and a lease lost under load (the CI's other fork running a cluster)
// hands the partition over and sends an attempt again, as it should (webhooks are at least once).
const settled: Partial<ActorSettingsShape> = { ...fast, leaseMs: 20_000, renewMs: 1_000 }

const withWorker = <A, E>(settings: Partial<WebhookSettingsShape>, body: Effect.Effect<A, E, Env>) =>
  Effect.gen(function* () {
    const prefix = uniquePrefix()
    const scope = yield* Scope.make()
    const deps = Mailbox.layer.pipe(
      Layer.provideMerge(sealLayerMemory),
      Layer.provideMerge(ActorSettings.layer(settled)),
      Layer.provideMerge(storageLayerPrefix(prefix)),
      Layer.provideMerge(natsLayerUrl(server.url, "test-webhooks")),
    )
    const context = yield* Layer.buildWithScope(deps, scope).pipe(Effect.orDie)
    const nats = Context.get(context, Nats)
    const storage = Context.get(context, Storage)
    const seal = Context.get(context, Seal)
    const full = { ...WebhookSettings.defaults, caFile, ...settings }
    const webhook = WebhookActor.make({
      nats,
      storage,
      seal,
      mailbox: Context.get(context, Mailbox.Mailbox),
      links,
      settings: full,
      ca: yield* WebhookActor.loadCa(full).pipe(Effect.orDie),
    })
    const account = AccountActor.make({ nats, storage, seal })
    const worker = yield* startWorker(server.url, prefix, [account, webhook], settled)
    return yield* body.pipe(
      Effect.provide(context),
      Effect.ensuring(worker.stop.pipe(Effect.zipRight(Scope.close(scope, Exit.void)))),
    )
  })

/** The account's `whpk_` key (made by the account actor on first use). */
const publicKeyOf = (account: string) =>
  Mailbox.ask(Account, account, { _tag: "EnsureWebhookKey" }, { timeout: "20 seconds" }).pipe(
    Effect.map((r) => (r as WebhookKeyReply).public_key),
  )

/** An independent Standard Webhooks `v1a` check (node:crypto Ed25519 over the raw public key). */
const verifies = (whpk: string, r: Received): boolean => {
  const x = Buffer.from(whpk.replace(/^whpk_/, ""), "base64").toString("base64url")
  const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" })
  const content = Buffer.from(`${r.headers["webhook-id"]}.${r.headers["webhook-timestamp"]}.${r.body}`)
  const [version, signature] = (r.headers["webhook-signature"] ?? "").split(",")
  return version === "v1a" && verify(null, content, key, Buffer.from(signature ?? "", "base64"))
}

const ids = () => ({
  account: makeId("acc") as AccountId,
  run: makeId("run") as RunId,
  event: makeId("evt") as EventId,
})

const commandEvent = (url: string): Deliver => {
  const { account, run, event } = ids()
  const body = JSON.stringify({
    id: event,
    type: "command.finished",
    created: timestamp(Date.now()),
    data: { run, command: { id: "cmd_x", kind: "bash", state: "succeeded", source: "caller", sequence: 1 } },
  })
  return { _tag: "Deliver", event, account, run, url, type: "command.finished", body }
}

const deliver = (d: Deliver, msgId: string = d.event) => Mailbox.send(Webhook, d.event, d, { msgId })

/** Waits until the delivery has ended (delivered or gave up) and answers its state. */
const ended = (event: string) =>
  eventually(
    State.read(Webhook, event).pipe(
      Effect.map((r) =>
        Option.flatMap(r, (rec) =>
          rec.state.state === "pending" ? Option.none() : Option.some(rec.state as WebhookState),
        ),
      ),
    ),
    "30 seconds",
    `webhook ${event} to end`,
  )

/** A fresh path token, so each test's requests are its own. */
const token = () => randomBytes(6).toString("hex")

const url = (host: string, path: string) => `https://${host}:${port}${path}`

describe("webhook actor", () => {
  it.live("a receiver failing twice then succeeding gets the same webhook-id three times, signed", () =>
    withWorker(
      { attemptDelaysMs: [0, 200, 200], allowPrivateTargets: true },
      Effect.gen(function* () {
        const d = commandEvent(url("127.0.0.1", `/flaky/${token()}`))
        const whpk = yield* publicKeyOf(d.account)
        yield* deliver(d)
        // The same event again (another message): changes nothing.
        yield* deliver(d, `${d.event}-again`)
        const state = yield* ended(d.event)
        expect(state.state).toBe("delivered")
        expect(state.made).toBe(3)
        expect(state.attempts.map((a) => a.status)).toEqual([503, 503, 204])
        expect(state.attempts[0]!.error).toMatch(/503/)
        expect(state.attempts[2]!.error).toBeUndefined()
        const path = new URL(d.url).pathname
        const got = requestsTo(path)
        expect(got).toHaveLength(3)
        for (const r of got) {
          expect(r.headers["webhook-id"]).toBe(d.event)
          expect(r.headers["content-type"]).toBe("application/json")
          expect(r.headers["webhook-timestamp"]).toMatch(/^\d{10}$/)
          expect(Math.abs(Number(r.headers["webhook-timestamp"]) * 1000 - Date.now())).toBeLessThan(60_000)
          expect(r.body).toBe(d.body)
          expect(verifies(whpk, r)).toBe(true)
          // Not verifiable with another account's key, nor with a changed body.
          expect(verifies(yield* publicKeyOf(makeId("acc")), r)).toBe(false)
          expect(verifies(whpk, { ...r, body: `${r.body} ` })).toBe(false)
        }
        // The repeated Deliver was handled before the delivery ended; still exactly three requests.
        const record = Option.getOrThrow(yield* State.read(Webhook, d.event))
        expect(record.failure).toBeUndefined()
        expect(requestsTo(path)).toHaveLength(3)
      }),
    ),
  )

  it.live("a run event carries a fresh signed output link from the stored run (to a host name)", () =>
    withWorker(
      { attemptDelaysMs: [0], allowPrivateTargets: true },
      Effect.gen(function* () {
        const { account, run, event } = ids()
        const stored: StoredRun = {
          id: run,
          account,
          function: makeId("fnc") as StoredRun["function"],
          version: 1,
          base: "debian-bookworm-20250101-0123456789ab" as StoredRun["base"],
          size: "s",
          provider: "none",
          prompt: "p",
          webhook: url("localhost", `/ok/${event}`),
          state: "succeeded",
          created_at: timestamp(Date.now() - 60_000),
          started_at: timestamp(Date.now() - 50_000),
          ended_at: timestamp(Date.now()),
          created_by: makeId("usr") as StoredRun["created_by"],
          output: { sha256: "0".repeat(64), bytes: 10, file_count: 1, files: [], object: run },
          usage: emptyUsage("s"),
          memory_mib: 1024,
          timeout_minutes: 30,
          log_parts: 0,
          seq: 7,
        }
        const { names } = yield* Storage
        const runs = yield* Kv.make(names.kv.runs.name, StoredRun)
        yield* runs.put(kvKeys.run(account, run), stored)
        const body = JSON.stringify({
          id: event,
          type: "run.succeeded",
          created: stored.ended_at,
          data: apiRun(stored, ""),
        })
        const whpk = yield* publicKeyOf(account)
        yield* deliver({
          _tag: "Deliver",
          event,
          account,
          run,
          url: stored.webhook!,
          type: "run.succeeded",
          body,
        })
        const state = yield* ended(event)
        expect(state.state).toBe("delivered")
        const [r] = requestsTo(`/ok/${event}`)
        expect(r).toBeDefined()
        expect(r!.headers.host).toBe(`localhost:${port}`)
        expect(verifies(whpk, r!)).toBe(true)
        const sent = JSON.parse(r!.body)
        const link = new URL(sent.data.output.url)
        expect(sent.data).toEqual(apiRun(stored, link.toString()))
        expect(link.origin).toBe("https://hangar.test")
        expect(link.pathname).toBe(`/v1/downloads/outputs/${run}`)
        const q = link.searchParams
        expect(q.get("account")).toBe(account)
        const verdict = links.verify(
          {
            store: "outputs",
            object: run,
            account,
            filename: q.get("filename")!,
            expires: Number(q.get("expires")),
          },
          q.get("sig")!,
        )
        expect(verdict).toBe("valid")
      }),
    ),
  )

  it.live("a 3xx is a failed attempt and the redirect is not followed", () =>
    withWorker(
      { attemptDelaysMs: [0, 100], allowPrivateTargets: true },
      Effect.gen(function* () {
        const d = commandEvent(url("127.0.0.1", `/redirect/${token()}`))
        yield* deliver(d)
        const state = yield* ended(d.event)
        expect(state.state).toBe("gave_up")
        expect(state.attempts.map((a) => a.status)).toEqual([302, 302])
        expect(state.attempts[0]!.error).toMatch(/302/)
        const path = new URL(d.url).pathname
        expect(requestsTo(path)).toHaveLength(2)
        expect(requestsTo(`/ok/followed${path}`)).toHaveLength(0)
      }),
    ),
  )

  it.live("a receiver that never answers times out", () =>
    withWorker(
      { attemptDelaysMs: [0, 100], answerTimeoutMs: 800, allowPrivateTargets: true },
      Effect.gen(function* () {
        const d = commandEvent(url("127.0.0.1", `/silent/${token()}`))
        yield* deliver(d)
        const state = yield* ended(d.event)
        expect(state.state).toBe("gave_up")
        expect(state.attempts).toHaveLength(2)
        for (const a of state.attempts) {
          expect(a.status).toBeUndefined()
          expect(a.error).toBe("no answer within 800 ms")
        }
        // Both requests reached the receiver, which held them.
        expect(requestsTo(new URL(d.url).pathname)).toHaveLength(2)
      }),
    ),
  )

  it.live("every kind of private target is refused without a connection", () =>
    withWorker(
      { attemptDelaysMs: [0, 50] },
      Effect.gen(function* () {
        const hosts: ReadonlyArray<readonly [string, RegExp]> = [
          ["127.0.0.1", /loopback/],
          ["localhost", /loopback/],
          ["[::1]", /loopback/],
          ["[::ffff:127.0.0.1]", /IPv4-mapped loopback/],
          ["127.1.2.3", /loopback/],
          ["0.0.0.0", /this network/],
          ["10.1.2.3", /private/],
          ["172.20.0.1", /private/],
          ["192.168.0.1", /private/],
          ["100.64.0.1", /CGNAT/],
          ["169.254.169.254", /link-local/],
          ["224.0.0.1", /multicast/],
          ["255.255.255.255", /broadcast/],
          ["198.18.0.1", /benchmarking/],
          ["192.0.2.1", /documentation/],
          ["[::]", /unspecified/],
          ["[fe80::1]", /link-local/],
          ["[fd00::1]", /unique-local/],
          ["[ff02::1]", /multicast/],
          ["[::ffff:10.0.0.1]", /IPv4-mapped private/],
          ["[::ffff:169.254.169.254]", /IPv4-mapped link-local/],
          ["[64:ff9b::a00:1]", /NAT64/],
          ["[64:ff9b:1::1]", /NAT64/],
          ["[2001:db8::1]", /documentation/],
          ["[2002:7f00:1::1]", /6to4/],
          ["[2001::1]", /Teredo/],
        ]
        const before = connections
        const events = hosts.map(([host]) => commandEvent(url(host, "/ok/private")))
        yield* Effect.forEach(events, (d) => deliver(d), { concurrency: 8, discard: true })
        for (const [i, d] of events.entries()) {
          const state = yield* ended(d.event)
          expect(state.state, hosts[i]![0]).toBe("gave_up")
          // Refused again on the second attempt (DNS answers may change, so it is retried).
          expect(state.attempts).toHaveLength(2)
          for (const a of state.attempts) {
            expect(a.status).toBeUndefined()
            expect(a.error, hosts[i]![0]).toMatch(/not a public address/)
            expect(a.error, hosts[i]![0]).toMatch(hosts[i]![1])
          }
        }
        expect(connections).toBe(before)
        expect(requestsTo("/ok/private")).toHaveLength(0)
      }),
    ),
  )

  it.live("a non-https address is refused at once, without a connection", () =>
    withWorker(
      { attemptDelaysMs: [0, 50, 50], allowPrivateTargets: true },
      Effect.gen(function* () {
        const before = connections
        const plain = commandEvent(`http://127.0.0.1:${port}/ok/plain`)
        const garbage = commandEvent("not a url")
        yield* deliver(plain)
        yield* deliver(garbage)
        const a = yield* ended(plain.event)
        expect(a.state).toBe("gave_up")
        expect(a.attempts).toHaveLength(1)
        expect(a.attempts[0]!.error).toBe("the webhook address is not https")
        const b = yield* ended(garbage.event)
        expect(b.state).toBe("gave_up")
        expect(b.attempts[0]!.error).toBe("the webhook address is not a valid URL")
        expect(connections).toBe(before)
        expect(requestsTo("/ok/plain")).toHaveLength(0)
      }),
    ),
  )
})
