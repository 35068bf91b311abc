/**
 * The account actor on a real nats-server and a real worker: idempotent adjustments under
 * concurrency (balance = sum of ledger = sum of distinct adjustments), balances, the webhook key
 * (stable, private part sealed in KV), the ledger reader, memory holds (`MayStart`/`Release`) and
 * compute charges.
 */
import { createPublicKey, sign, verify } from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Kvm } from "@nats-io/kv"
import { Effect, Option } from "effect"
import * as Client from "../../core/actors/AccountClient.ts"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import * as State from "../../core/actors/State.ts"
import { clientLayer } from "../../core/actors/testing/Harness.ts"
import { makeId } from "../../core/Ids.ts"
import * as Ledger from "../../core/Ledger.ts"
import { Nats } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import {
  Account,
  type Adjust,
  appliedLimit,
  type Charge,
  type WebhookKeyReply,
} from "../../schema/actors/Account.ts"
import { timestamp } from "../../schema/Common.ts"
import type { KeyId, LedgerEntryId, RunId } from "../../schema/Ids.ts"
import { minutePriceUsdNanos } from "../../schema/Limits.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { openWebhookKey } from "./Account.ts"
import { type AccountWorker, startAccountWorker } from "./testing.ts"

let server: StartedNatsServer
beforeAll(async () => {
  server = await startNatsServer()
})
afterAll(() => server?.stop())

const withWorker = <A, E>(
  body: (w: AccountWorker) => Effect.Effect<A, E, Mailbox.Mailbox | Nats | Storage>,
) => {
  const prefix = uniquePrefix()
  return Effect.gen(function* () {
    const w = yield* startAccountWorker(server.url, prefix)
    return yield* body(w).pipe(Effect.ensuring(w.stop))
  }).pipe(Effect.provide(clientLayer(server.url, prefix)))
}

const adjust = (amount: number, entry = makeId("led")): Adjust => ({
  _tag: "Adjust",
  entry_id: entry as LedgerEntryId,
  kind: amount >= 0 ? "purchase" : "refund",
  amount_usd_nanos: amount,
  effective_at: timestamp(Date.now()),
})

const balanceOf = (account: string) => Client.askBalance(account, "20 seconds")

describe("account actor", () => {
  it.live(
    "50 concurrent adjustments, mixed signs, a third sent twice: balance = ledger sum = distinct sum",
    () =>
      withWorker(() =>
        Effect.gen(function* () {
          const account = makeId("acc")
          const distinct = Array.from({ length: 50 }, (_, i) =>
            adjust((i % 3 === 0 ? -1 : 1) * (i + 1) * 1_000_000_007),
          )
          // Every third one again: once with the same msgId (dropped by the mailbox), once with a new
          // one (reaches the actor, which must recognise the entry id).
          const sends = distinct.flatMap((m, i) => {
            const first = { m, msgId: m.entry_id }
            if (i % 3 !== 0) return [first]
            return [first, { m, msgId: m.entry_id }, { m, msgId: `${m.entry_id}-again` }]
          })
          yield* Effect.forEach(sends, (s) => Mailbox.send(Account, account, s.m, { msgId: s.msgId }), {
            concurrency: 50,
            discard: true,
          })
          const expected = distinct.reduce((t, m) => t + m.amount_usd_nanos, 0)
          const reply = yield* balanceOf(account)
          expect(reply).toEqual({
            balance_usd_nanos: expected,
            minimum_balance_usd_nanos: 0,
            available_usd_nanos: expected,
          })
          const entries = yield* Ledger.read(account)
          expect(entries).toHaveLength(50)
          expect(new Set(entries.map((e) => e.id))).toEqual(new Set(distinct.map((m) => m.entry_id)))
          expect(yield* Ledger.sum(account)).toBe(expected)
          // The stream itself holds each entry once (the actor did not publish the repeats).
          const { jsm } = yield* Nats
          const { names } = yield* Storage
          const info = yield* Effect.promise(() =>
            jsm.streams.info(names.streams.LEDGER.name, { subjects_filter: names.subjects.ledger(account) }),
          )
          expect(info.state.messages).toBe(50)
          const record = yield* State.read(Account, account)
          expect(Option.getOrThrow(record).state.applied).toHaveLength(50)
        }),
      ),
  )

  it.live("the same entry id asked twice credits once and answers the same balance", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const account = makeId("acc")
        const m = { ...adjust(5_000_000_000), reference: "pi_123" }
        const a = yield* Mailbox.ask(Account, account, m, { timeout: "20 seconds" })
        const b = yield* Mailbox.ask(Account, account, m, { timeout: "20 seconds" })
        expect(a).toEqual({ balance_usd_nanos: 5_000_000_000 })
        expect(b).toEqual({ balance_usd_nanos: 5_000_000_000 })
        const entries = yield* Ledger.read(account)
        expect(entries).toEqual([
          {
            id: m.entry_id,
            account,
            kind: "purchase",
            amount_usd_nanos: 5_000_000_000,
            effective_at: m.effective_at,
            external_reference: "pi_123",
          },
        ])
        expect(yield* Client.balance(account)).toEqual({
          balance_usd_nanos: 5_000_000_000,
          minimum_balance_usd_nanos: 0,
          available_usd_nanos: 5_000_000_000,
        })
      }),
    ),
  )

  it.live(
    "remembers the last 1,000 entry ids, oldest dropped first",
    () =>
      withWorker(() =>
        Effect.gen(function* () {
          const account = makeId("acc")
          const ids = Array.from({ length: appliedLimit + 1 }, () => makeId("led"))
          yield* Effect.forEach(ids, (id) => Mailbox.send(Account, account, adjust(1, id), { msgId: id }), {
            concurrency: 16,
            discard: true,
          })
          expect((yield* balanceOf(account)).balance_usd_nanos).toBe(appliedLimit + 1)
          const applied = Option.getOrThrow(yield* State.read(Account, account)).state.applied
          expect(applied).toHaveLength(appliedLimit)
          expect(applied).toEqual(ids.slice(1))
        }),
      ),
    120_000,
  )

  it.live("refuses an Adjust whose amount is not an integer or whose entry id is not led_", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const account = makeId("acc")
        const fractional = yield* Effect.flip(
          Mailbox.send(Account, account, adjust(1.5), { msgId: makeId("led") }),
        )
        expect(fractional._tag).toBe("MessageInvalid")
        expect(fractional.message).toContain("amount_usd_nanos")
        const wrongId = yield* Effect.flip(
          Mailbox.send(
            Account,
            account,
            adjust(1, makeId("run") as unknown as ReturnType<typeof makeId<"led">>),
            { msgId: makeId("led") },
          ),
        )
        expect(wrongId.message).toContain("entry_id")
      }),
    ),
  )

  it.live("the webhook key is made once, stable, and its private part is sealed in KV", () =>
    withWorker((w) =>
      Effect.gen(function* () {
        const account = makeId("acc")
        const ask = Mailbox.ask(Account, account, { _tag: "EnsureWebhookKey" }, { timeout: "20 seconds" })
        const first = yield* ask
        const second = yield* ask
        expect(first).toEqual(second)
        const key = (first as WebhookKeyReply).public_key
        expect(key).toMatch(/^whpk_[A-Za-z0-9+/]{43}=$/)
        expect(yield* Client.webhookKey(account)).toBe(key)

        const stored = Option.getOrThrow(yield* State.read(Account, account)).state.webhook_key!
        const privateKey = yield* openWebhookKey(w.seal, account, stored)
        const der = privateKey.export({ format: "der", type: "pkcs8" })
        const seed = der.subarray(der.length - 32)
        // The pair matches: a signature by the private key verifies with the published public key.
        const publicKey = createPublicKey({
          key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(key.slice(5), "base64").toString("base64url") },
          format: "jwk",
        })
        const signature = sign(null, Buffer.from("hi"), privateKey)
        expect(verify(null, Buffer.from("hi"), publicKey, signature)).toBe(true)

        // The raw KV value holds no form of the private key.
        const { js } = yield* Nats
        const { names } = yield* Storage
        const raw = yield* Effect.promise(async () => {
          const kv = await new Kvm(js).open(names.kv.actors.name)
          return (await kv.get(kvKeys.actor("account", account)))!.value
        })
        const text = Buffer.from(raw).toString("latin1")
        for (const form of ["base64", "base64url", "hex", "latin1"] as const) {
          expect(text).not.toContain(seed.toString(form))
          expect(text).not.toContain(der.toString(form))
        }
        expect(text).toContain(stored.public)
      }),
    ),
  )

  it.live("Ledger.read keeps entries effective at or after the given time", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const account = makeId("acc")
        const now = Date.now()
        const old = { ...adjust(7), effective_at: timestamp(now - 31 * 86_400_000) }
        const edge = { ...adjust(11), effective_at: timestamp(now - 30 * 86_400_000) }
        const recent = adjust(13)
        for (const m of [old, edge, recent])
          yield* Mailbox.ask(Account, account, m, { timeout: "20 seconds" })
        const since = yield* Ledger.read(account, now - 30 * 86_400_000)
        expect(since.map((e) => e.id)).toEqual([edge.entry_id, recent.entry_id])
        expect(yield* Ledger.sum(account)).toBe(31)
        expect(yield* Ledger.read(makeId("acc"))).toEqual([])
      }),
    ),
  )
})

const heldOf = (account: string) =>
  Effect.map(State.read(Account, account), (r) =>
    Option.match(r, {
      onNone: () => ({ memory_held_mib: 0, holds: {} }),
      onSome: (x) => ({ memory_held_mib: x.state.memory_held_mib, holds: x.state.holds }),
    }),
  )

const charge = (run: RunId, from: number, through: number, amount: number): Charge => ({
  _tag: "Charge",
  entry_id: makeId("led") as LedgerEntryId,
  amount_usd_nanos: amount,
  effective_at: timestamp(Date.now()),
  run,
  function: makeId("fnc") as Charge["function"],
  version: 3,
  size: "s",
  provider: "none",
  started_by: makeId("key") as KeyId,
  external_reference: "order-7",
  from_minute: from,
  through_minute: through,
  memory_mib: 2048,
  rate_usd_nanos_per_gib_hour: 150_000_000,
})

describe("account actor: runs", () => {
  it.live("MayStart refuses no_credit at the minimum balance and allows one nanodollar above it", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const account = makeId("acc")
        const run = makeId("run") as RunId
        // A new account: balance 0 = the minimum 0.
        expect(yield* Client.mayStart(account, run, 2048, 8192, "20 seconds")).toEqual({
          refused: "no_credit",
        })
        yield* Client.adjust(account, "purchase", 1)
        expect(yield* Client.mayStart(account, run, 2048, 8192, "20 seconds")).toEqual({ ok: true })
        yield* Client.adjust(account, "refund", -1)
        // Refused runs hold nothing; the run asked while in credit still holds its memory.
        expect(yield* heldOf(account)).toEqual({ memory_held_mib: 2048, holds: { [run]: 2048 } })
        expect(yield* Client.mayStart(account, makeId("run") as RunId, 1, 8192, "20 seconds")).toEqual({
          refused: "no_credit",
        })
      }),
    ),
  )

  it.live("MayStart holds memory up to the limit exactly, once per run; Release frees it once", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const account = makeId("acc")
        yield* Client.adjust(account, "purchase", 1_000_000_000)
        const [a, b, c] = [makeId("run"), makeId("run"), makeId("run")] as Array<RunId>
        const ask = (run: RunId, mib: number) => Client.mayStart(account, run, mib, 8192, "20 seconds")
        expect(yield* ask(a!, 4096)).toEqual({ ok: true })
        // Asked again (a retried start): ok, held once.
        expect(yield* ask(a!, 4096)).toEqual({ ok: true })
        // 4096 + 4097 > 8192: refused; 4096 + 4096 = 8192: allowed.
        expect(yield* ask(b!, 4097)).toEqual({ refused: "memory_limit" })
        expect(yield* ask(b!, 4096)).toEqual({ ok: true })
        expect(yield* ask(c!, 1)).toEqual({ refused: "memory_limit" })
        expect(yield* heldOf(account)).toEqual({ memory_held_mib: 8192, holds: { [a!]: 4096, [b!]: 4096 } })

        // Release twice and release of a run that never held: the hold goes once.
        for (const run of [a!, a!, c!])
          yield* Mailbox.send(Account, account, { _tag: "Release", run }, { msgId: makeId("led") })
        expect(yield* ask(c!, 4096)).toEqual({ ok: true })
        expect(yield* heldOf(account)).toEqual({ memory_held_mib: 8192, holds: { [b!]: 4096, [c!]: 4096 } })
      }),
    ),
  )

  it.live("Charge debits once per entry id and writes a compute entry with the run's fields", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const account = makeId("acc")
        const run = makeId("run") as RunId
        yield* Client.adjust(account, "purchase", 1_000_000_000)
        const price = minutePriceUsdNanos(2048)
        const first = charge(run, 1, 1, price)
        const next = charge(run, 2, 4, 3 * price)
        expect(yield* Mailbox.ask(Account, account, first, { timeout: "20 seconds" })).toEqual({
          balance_usd_nanos: 1_000_000_000 - price,
        })
        // The same entry id again (another send): nothing changes.
        yield* Mailbox.send(Account, account, first, { msgId: makeId("led") })
        expect(yield* Mailbox.ask(Account, account, next, { timeout: "20 seconds" })).toEqual({
          balance_usd_nanos: 1_000_000_000 - 4 * price,
        })
        const entries = yield* Ledger.read(account)
        // Written out for the first; the second differs in id, amount and minutes.
        const expected = (m: Charge) => {
          const { _tag, entry_id, amount_usd_nanos, ...fields } = m
          return { id: entry_id, account, kind: "compute", amount_usd_nanos: -amount_usd_nanos, ...fields }
        }
        expect(expected(first)).toEqual({
          id: first.entry_id,
          account,
          kind: "compute",
          amount_usd_nanos: -price,
          effective_at: first.effective_at,
          run,
          function: first.function,
          version: 3,
          size: "s",
          provider: "none",
          started_by: first.started_by,
          external_reference: "order-7",
          from_minute: 1,
          through_minute: 1,
          memory_mib: 2048,
          rate_usd_nanos_per_gib_hour: 150_000_000,
        })
        expect(entries.filter((e) => e.kind === "compute")).toEqual([expected(first), expected(next)])
        expect(yield* Ledger.sum(account)).toBe(1_000_000_000 - 4 * price)
      }),
    ),
  )
})
