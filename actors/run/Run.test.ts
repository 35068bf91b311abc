/**
 * The run actor on a real nats-server and real workers (account, run and scheduler actors), driven
 * as the gateway and a host agent drive it: `Create`/`AddCommand`/`CancelCommand` asked, `Started`,
 * `Succeed`, `Fail` sent; what it sends a host or a webhook is read from their mailbox subjects.
 * Life cycle, every end the actor decides itself (queue timeout, timeout, credit, suspension),
 * commands, and billing (minutes charged as the run goes, once each, across redeliveries and a
 * worker crash).
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, type Layer, Option, type Scope } from "effect"
import * as Accounts from "../../core/Accounts.ts"
import * as Client from "../../core/actors/AccountClient.ts"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import * as State from "../../core/actors/State.ts"
import { clientLayer, eventually, fast } from "../../core/actors/testing/Harness.ts"
import { derivedId, makeId } from "../../core/Ids.ts"
import * as Kv from "../../core/Kv.ts"
import * as Ledger from "../../core/Ledger.ts"
import { Storage } from "../../core/Storage.ts"
import { Account } from "../../schema/actors/Account.ts"
import { Host, type HostMessage } from "../../schema/actors/Host.ts"
import { type Create, Run, type RunReply } from "../../schema/actors/Run.ts"
import { Scheduler, schedulerId } from "../../schema/actors/Scheduler.ts"
import { Webhook, type WebhookMessage } from "../../schema/actors/Webhook.ts"
import { CommandIndex, CommandRecord } from "../../schema/Command.ts"
import { timestamp } from "../../schema/Common.ts"
import type { AccountId, BaseName, CommandId, FunctionId, KeyId, RunId } from "../../schema/Ids.ts"
import { minutePriceUsdNanos } from "../../schema/Limits.ts"
import { apiRun, type StoredOutput, type StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { details } from "./Run.ts"
import { inbox, type RunWorkerOptions, startRunWorker, storedRun } from "./testing.ts"

let server: StartedNatsServer
beforeAll(async () => {
  server = await startNatsServer()
})
afterAll(() => server?.stop())

type Env = Layer.Layer.Success<ReturnType<typeof clientLayer>>

/** Runs `body` with a worker (own settings) and a client on a fresh storage prefix. */
const withWorker = <A, E>(
  options: RunWorkerOptions,
  body: (prefix: string) => Effect.Effect<A, E, Env | Scope.Scope>,
) => {
  const prefix = uniquePrefix()
  return Effect.gen(function* () {
    const w = yield* startRunWorker(server.url, prefix, options)
    return yield* body(prefix).pipe(Effect.ensuring(w.stop))
  }).pipe(Effect.scoped, Effect.provide(clientLayer(server.url, prefix, fast)))
}

const price = minutePriceUsdNanos(2048)

const createOf = (account: string, overrides: Partial<Create> = {}): Create => ({
  _tag: "Create",
  id: makeId("run") as RunId,
  account: account as AccountId,
  function: makeId("fnc") as FunctionId,
  version: 2,
  base: "debian-bookworm-20250101-0123456789ab" as BaseName,
  size: "s",
  memory_mib: 2048,
  provider: "none",
  prompt: "do the thing",
  timeout_minutes: 30,
  created_at: timestamp(Date.now()),
  created_by: makeId("key") as KeyId,
  ...overrides,
})

const ask = (run: string, message: Parameters<typeof Mailbox.ask<typeof Run>>[2]) =>
  Mailbox.ask(Run, run, message, { timeout: "20 seconds" })

const send = (run: string, message: Parameters<typeof Mailbox.send<typeof Run>>[2]) =>
  Mailbox.send(Run, run, message, { msgId: makeId("evt") })

/** Creates the run with credit and its memory held, as the gateway does. */
const startRun = (overrides: Partial<Create> = {}, credit = 1_000_000_000) =>
  Effect.gen(function* () {
    const account = (overrides.account ?? makeId("acc")) as AccountId
    if (credit !== 0) yield* Client.adjust(account, "purchase", credit)
    const create = createOf(account, overrides)
    expect(yield* Client.mayStart(account, create.id, create.memory_mib, 32_768, "20 seconds")).toEqual({
      ok: true,
    })
    const reply = yield* ask(create.id, create)
    return { account, create, reply }
  })

const runOf = (reply: RunReply): StoredRun => {
  if (!("run" in reply)) throw new Error(`expected a run, got ${JSON.stringify(reply)}`)
  return reply.run
}

const commandOf = (reply: RunReply): CommandRecord => {
  if (!("command" in reply)) throw new Error(`expected a command, got ${JSON.stringify(reply)}`)
  return reply.command
}

/** Waits until the stored run satisfies `f`. */
const runWhere = (account: string, run: string, f: (r: StoredRun) => boolean, what: string) =>
  eventually(Effect.map(storedRun(account, run), Option.filter(f)), "30 seconds", what)

const ended = (account: string, run: string) =>
  runWhere(account, run, (r) => r.state === "succeeded" || r.state === "failed", `run ${run} to end`)

/** The compute entries of the account, in ledger order. */
const computeEntries = (account: string) =>
  Effect.map(Ledger.read(account), (entries) => entries.filter((e) => e.kind === "compute"))

/** The run actor's state. */
const actorState = (run: string) => Effect.map(State.read(Run, run), (r) => Option.getOrThrow(r).state)

/** The account actor's memory held. */
const heldOf = (account: string) =>
  Effect.map(State.read(Account, account), (r) => Option.getOrThrow(r).state.memory_held_mib)

const isStop = (m: HostMessage): m is Extract<HostMessage, { _tag: "Stop" }> => m._tag === "Stop"

const output: StoredOutput = {
  sha256: "a".repeat(64),
  bytes: 120,
  file_count: 1,
  files: [{ path: "result.txt", bytes: 5, dir: false }],
  object: "run_object",
}

describe("run actor: life cycle", () => {
  it.live("queued → running → succeeded: record, host messages, charge, release, webhook event", () =>
    withWorker({}, () =>
      Effect.gen(function* () {
        const host = `host_${makeId("run").slice(4)}`
        const hostBox = yield* inbox(Host, host)
        const { account, create, reply } = yield* startRun({
          webhook: "https://example.com/hook",
          external_reference: "ref-1",
        })
        const event = derivedId("evt", create.id)
        const hookBox = yield* inbox(Webhook, event)
        const queued = runOf(reply)
        expect(queued).toMatchObject({ id: create.id, state: "queued", log_parts: 0, memory_mib: 2048 })
        expect(queued.started_at).toBeUndefined()
        // Create again (a retried start): the same record, nothing new.
        expect(runOf(yield* ask(create.id, create))).toEqual(queued)
        expect(Option.getOrThrow(yield* storedRun(account, create.id))).toEqual(queued)
        // The scheduler holds it, waiting (no host is registered).
        const sched = yield* eventually(
          Effect.map(State.read(Scheduler, schedulerId), (r) =>
            Option.filter(r, (x) => x.state.queue.some((w) => w.run === create.id)),
          ),
          "20 seconds",
          "the run to wait at the scheduler",
        )
        expect(sched.state.queue.find((w) => w.run === create.id)).toMatchObject({
          account,
          size: "s",
          vcpus: 1,
          memory_mib: 2048,
        })

        const startedAt = Date.now()
        yield* send(create.id, { _tag: "Started", host, at: timestamp(startedAt) })
        const running = yield* runWhere(account, create.id, (r) => r.state === "running", "running")
        expect(running).toMatchObject({ started_at: timestamp(startedAt), host })
        yield* send(create.id, { _tag: "Ready", at: timestamp(Date.now()) })
        yield* send(create.id, { _tag: "LogPart", n: 2 })
        yield* send(create.id, { _tag: "LogPart", n: 1 })
        const model = {
          calls: 3,
          input_tokens: 100,
          cache_read_tokens: 10,
          cache_write_tokens: 5,
          output_tokens: 50,
          web_searches: 1,
        }
        yield* send(create.id, { _tag: "Usage", model })
        yield* runWhere(
          account,
          create.id,
          (r) => r.log_parts === 2 && r.usage.model.calls === 3,
          "log, usage",
        )

        const endedAt = startedAt + 1_500
        yield* send(create.id, { _tag: "Succeed", output, message: "done", at: timestamp(endedAt) })
        const done = yield* ended(account, create.id)
        expect(done).toMatchObject({
          state: "succeeded",
          output,
          message: "done",
          ended_at: timestamp(endedAt),
          log_parts: 2,
          usage: { compute: { size: "s", seconds: 2 }, model },
        })
        expect(done.failure).toBeUndefined()
        // The log is whole once the machine's last part is told (here one already counted: the
        // timer stored the `end` line before the machine's own flush found nothing left).
        expect(done.log_complete).toBeUndefined()
        yield* send(create.id, { _tag: "LogPart", n: 2, last: true })
        const whole = yield* runWhere(account, create.id, (r) => r.log_complete === true, "log complete")
        expect(whole).toMatchObject({ state: "succeeded", log_parts: 2 })
        // A late failure changes nothing.
        yield* send(create.id, {
          _tag: "Fail",
          failure: "provider",
          detail: "late",
          at: timestamp(Date.now()),
        })

        expect(yield* hostBox.next()).toEqual({ _tag: "Stop", run: create.id })
        // One started minute, charged once, with the run's fields.
        const entries = yield* eventually(
          Effect.map(computeEntries(account), (es) => (es.length > 0 ? Option.some(es) : Option.none())),
        )
        expect(entries).toEqual([
          {
            id: derivedId("led", `${create.id}:1-1`),
            account,
            kind: "compute",
            amount_usd_nanos: -price,
            effective_at: timestamp(startedAt),
            run: create.id,
            function: create.function,
            version: 2,
            size: "s",
            provider: "none",
            started_by: create.created_by,
            external_reference: "ref-1",
            from_minute: 1,
            through_minute: 1,
            memory_mib: 2048,
            rate_usd_nanos_per_gib_hour: 150_000_000,
          },
        ])
        yield* eventually(Effect.map(heldOf(account), (h) => (h === 0 ? Option.some(h) : Option.none())))
        const deliver = yield* hookBox.next()
        expect(deliver).toMatchObject({
          _tag: "Deliver",
          event,
          account,
          run: create.id,
          url: "https://example.com/hook",
          type: "run.succeeded",
        })
        const body = JSON.parse((deliver as Extract<WebhookMessage, { _tag: "Deliver" }>).body)
        const final = Option.getOrThrow(yield* storedRun(account, create.id))
        expect(body).toEqual({
          id: event,
          type: "run.succeeded",
          created: timestamp(endedAt),
          data: JSON.parse(JSON.stringify(apiRun(final, ""))),
        })
        expect(body.data.output.url).toBe("")
        expect(body.data.seq).toBeUndefined()
      }),
    ),
  )

  it.live("a run that ended queued (queue timeout) is dequeued, released, and a late start is stopped", () =>
    withWorker({ run: { queueTimeoutMs: 1_000 } }, () =>
      Effect.gen(function* () {
        const { account, create } = yield* startRun({ webhook: "https://example.com/h" })
        const hookBox = yield* inbox(Webhook, derivedId("evt", create.id))
        const done = yield* ended(account, create.id)
        expect(done).toMatchObject({
          state: "failed",
          failure: "infrastructure",
          detail: details.queueTimeout(1_000),
          ended_at: timestamp(Date.parse(create.created_at) + 1_000),
          usage: { compute: { seconds: 0 } },
        })
        expect(done.started_at).toBeUndefined()
        expect(yield* hookBox.next()).toMatchObject({ type: "run.failed" })
        yield* eventually(Effect.map(heldOf(account), (h) => (h === 0 ? Option.some(h) : Option.none())))
        yield* eventually(
          Effect.map(State.read(Scheduler, schedulerId), (r) =>
            Option.filter(r, (x) => !x.state.queue.some((w) => w.run === create.id)),
          ),
          "20 seconds",
          "the scheduler to forget the run",
        )
        // A host that took it meanwhile is told to stop; nothing is charged.
        const host = "late-host"
        const hostBox = yield* inbox(Host, host)
        yield* send(create.id, { _tag: "Started", host, at: timestamp(Date.now()) })
        expect(yield* hostBox.next()).toEqual({ _tag: "Stop", run: create.id })
        expect((yield* actorState(create.id)).run?.state).toBe("failed")
        expect(yield* computeEntries(account)).toEqual([])
      }),
    ),
  )

  it.live("timeout_minutes ends a running run at its deadline, billed exactly its minutes", () =>
    withWorker({ run: { minuteMs: 1_000 } }, () =>
      Effect.gen(function* () {
        const { account, create } = yield* startRun({ timeout_minutes: 2 })
        const hostBox = yield* inbox(Host, "h-timeout")
        const startedAt = Date.now()
        yield* send(create.id, { _tag: "Started", host: "h-timeout", at: timestamp(startedAt) })
        const done = yield* ended(account, create.id)
        expect(done).toMatchObject({
          state: "failed",
          failure: "timeout",
          detail: details.timeout(2),
          ended_at: timestamp(startedAt + 2_000),
          usage: { compute: { seconds: 2 } },
        })
        expect(yield* hostBox.nextWhere(isStop)).toEqual({ _tag: "Stop", run: create.id })
        expect((yield* actorState(create.id)).charged_through).toBe(2)
        const entries = yield* computeEntries(account)
        expect(entries.reduce((n, e) => n + e.amount_usd_nanos, 0)).toBe(-2 * price)
        expect(entries.map((e) => [e.from_minute, e.through_minute])).toEqual([
          [1, 1],
          [2, 2],
        ])
      }),
    ),
  )

  it.live("Fail ends a running run with its cause, detail and message; unknown runs answer unknown", () =>
    withWorker({}, () =>
      Effect.gen(function* () {
        const unknownRun = makeId("run")
        expect(
          yield* ask(unknownRun, {
            _tag: "AddCommand",
            id: makeId("cmd") as CommandId,
            kind: "bash",
            arguments: { command: "true", timeout_ms: 1000 },
            source: "caller",
            created_at: timestamp(Date.now()),
          }),
        ).toEqual({ unknown: true })
        expect(
          yield* ask(unknownRun, { _tag: "CancelCommand", id: makeId("cmd") as CommandId, sequence: 1 }),
        ).toEqual({ unknown: true })

        const { account, create } = yield* startRun()
        const hostBox = yield* inbox(Host, "h-fail")
        const at = Date.now()
        yield* send(create.id, { _tag: "Started", host: "h-fail", at: timestamp(at) })
        yield* send(create.id, {
          _tag: "Fail",
          failure: "no_submission",
          detail: "finished as failed: gave up",
          message: "I could not do it",
          at: timestamp(at + 61_000),
        })
        const done = yield* ended(account, create.id)
        expect(done).toMatchObject({
          state: "failed",
          failure: "no_submission",
          detail: "finished as failed: gave up",
          message: "I could not do it",
          usage: { compute: { seconds: 61 } },
        })
        expect(done.output).toBeUndefined()
        expect(yield* hostBox.nextWhere(isStop)).toEqual({ _tag: "Stop", run: create.id })
        // 61 seconds: two started minutes, the second charged at the end.
        const entries = yield* eventually(
          Effect.map(computeEntries(account), (es) => (es.length === 2 ? Option.some(es) : Option.none())),
        )
        expect(entries.map((e) => e.id)).toEqual([
          derivedId("led", `${create.id}:1-1`),
          derivedId("led", `${create.id}:2-2`),
        ])
      }),
    ),
  )
})

/** A new `bash` command for the run actor. */
const addOf = (command = "true", source: "caller" | "agent" = "caller") => ({
  _tag: "AddCommand" as const,
  id: makeId("cmd") as CommandId,
  kind: "bash" as const,
  arguments: { command, timeout_ms: 1000 },
  source,
  created_at: timestamp(Date.now()),
})

/** The record an add of `add` answers when given `sequence`. */
const queuedOf = (add: ReturnType<typeof addOf>, run: string, sequence: number) => ({
  id: add.id,
  run,
  kind: add.kind,
  arguments: add.arguments,
  source: add.source,
  sequence,
  state: "queued",
  created_at: add.created_at,
})

describe("run actor: commands", () => {
  const commandsKv = Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.commands.name, CommandRecord))
  const recordAt = (run: string, seq: number) =>
    Effect.map(
      Effect.flatMap(commandsKv, (kv) => kv.get(kvKeys.command(run, seq))),
      (e) => Option.getOrThrow(e),
    )

  it.live(
    "sequences, idempotent adds, cancel while queued and by the host, cancelled at the end, run_ended",
    () =>
      withWorker({}, () =>
        Effect.gen(function* () {
          const { account, create } = yield* startRun()
          const run = create.id
          const [a, b, c, d] = [addOf("a"), addOf("b"), addOf("c"), addOf("d")]
          const first = commandOf(yield* ask(run, a))
          expect(first).toEqual(queuedOf(a, run, 1))
          // The same id again: the same record, no new sequence.
          expect(commandOf(yield* ask(run, a))).toEqual(first)
          expect(commandOf(yield* ask(run, { ...b, source: "agent" }))).toMatchObject({
            sequence: 2,
            source: "agent",
          })
          expect(commandOf(yield* ask(run, c))).toMatchObject({ sequence: 3 })
          expect((yield* recordAt(run, 1)).value).toEqual(first)

          // Queued run, no machine: cancelled here; again: unchanged.
          const cancelledA = commandOf(yield* ask(run, { _tag: "CancelCommand", id: a.id, sequence: 1 }))
          expect(cancelledA).toMatchObject({ id: a.id, state: "cancelled" })
          expect(cancelledA.ended_at).toBeDefined()
          expect(commandOf(yield* ask(run, { _tag: "CancelCommand", id: a.id, sequence: 1 }))).toEqual(
            cancelledA,
          )
          // A wrong id for the sequence is unknown.
          expect(yield* ask(run, { _tag: "CancelCommand", id: b.id, sequence: 3 })).toEqual({ unknown: true })

          // Running on a host: the host kills it; the reply is the record as it stands.
          const hostBox = yield* inbox(Host, "h-cmd")
          yield* send(run, { _tag: "Started", host: "h-cmd", at: timestamp(Date.now()) })
          yield* runWhere(account, run, (r) => r.state === "running", "running")
          // The host runs b and finishes c (as its agent writes records, by CAS).
          const kv = yield* commandsKv
          const bRec = yield* recordAt(run, 2)
          yield* kv.update(
            kvKeys.command(run, 2),
            { ...bRec.value, state: "running", started_at: timestamp(Date.now()) } as CommandRecord,
            bRec.revision,
          )
          const cRec = yield* recordAt(run, 3)
          const cDone = {
            ...cRec.value,
            state: "succeeded",
            ended_at: timestamp(Date.now()),
            result: {
              exit_code: 0,
              output: "c",
              output_bytes: 1,
              truncated: false,
              timed_out: false,
              oom_killed: false,
            },
          } as CommandRecord
          yield* kv.update(kvKeys.command(run, 3), cDone, cRec.revision)
          const asked = commandOf(yield* ask(run, { _tag: "CancelCommand", id: b.id, sequence: 2 }))
          expect(asked).toMatchObject({ id: b.id, state: "running" })
          expect(yield* hostBox.next()).toEqual({ _tag: "CancelCommand", run, command: b.id, sequence: 2 })
          // An ended command is unchanged and the host is not bothered.
          expect(commandOf(yield* ask(run, { _tag: "CancelCommand", id: c.id, sequence: 3 }))).toEqual(cDone)
          expect(commandOf(yield* ask(run, d))).toMatchObject({ sequence: 4, state: "queued" })

          yield* send(run, { _tag: "Succeed", output, at: timestamp(Date.now()) })
          yield* ended(account, run)
          expect(yield* hostBox.next()).toEqual({ _tag: "Stop", run })
          // Not ended at the end → cancelled; ended ones keep their result.
          expect((yield* recordAt(run, 1)).value).toEqual(cancelledA)
          expect((yield* recordAt(run, 2)).value).toMatchObject({ state: "cancelled" })
          expect((yield* recordAt(run, 3)).value).toEqual(cDone)
          expect((yield* recordAt(run, 4)).value).toMatchObject({ state: "cancelled" })
          // After the end: new commands are refused; a known one still answers its record.
          expect(yield* ask(run, addOf("e"))).toEqual({ ended: true })
          expect(commandOf(yield* ask(run, d))).toMatchObject({ id: d.id, state: "cancelled" })
          expect((yield* actorState(run)).next_sequence).toBe(5)
        }),
      ),
  )
})

describe("run actor: commands whose end is never reported", () => {
  const commandsKv = Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.commands.name, CommandRecord))
  const entryAt = (run: string, seq: number) =>
    Effect.map(
      Effect.flatMap(commandsKv, (kv) => kv.get(kvKeys.command(run, seq))),
      (e) => Option.getOrThrow(e),
    )
  const GRACE_MS = 400

  it.live(
    "fail at their timeout (from when the machine was ready) plus the grace, and the host is told to kill them; the others are left alone",
    () =>
      withWorker({ run: { commandGraceMs: GRACE_MS } }, () =>
        Effect.gen(function* () {
          const { account, create } = yield* startRun()
          const run = create.id
          const kv = yield* commandsKv
          const hostBox = yield* inbox(Host, "h-lost")
          // Added while the run is queued: its deadline counts from when the machine is ready.
          const lost = { ...addOf("sleep 600"), arguments: { command: "sleep 600", timeout_ms: 300 } }
          expect(commandOf(yield* ask(run, lost)).sequence).toBe(1)
          yield* send(run, { _tag: "Started", host: "h-lost", at: timestamp(Date.now()) })
          yield* runWhere(account, run, (r) => r.state === "running", "running")
          const readyAt = Date.now()
          yield* send(run, { _tag: "Ready", at: timestamp(readyAt) })
          // The host takes it (running), then never reports its end.
          const taken = yield* entryAt(run, 1)
          yield* kv.update(
            kvKeys.command(run, 1),
            { ...taken.value, state: "running", started_at: timestamp(Date.now()) } as CommandRecord,
            taken.revision,
          )
          // One the host ends in time, and one with a long timeout still running.
          const quick = { ...addOf("true"), arguments: { command: "true", timeout_ms: 200 } }
          expect(commandOf(yield* ask(run, quick)).sequence).toBe(2)
          const quickEntry = yield* entryAt(run, 2)
          const quickDone = {
            ...quickEntry.value,
            state: "succeeded",
            ended_at: timestamp(Date.now()),
            result: {
              exit_code: 0,
              output: "",
              output_bytes: 0,
              truncated: false,
              timed_out: false,
              oom_killed: false,
            },
          } as CommandRecord
          yield* kv.update(kvKeys.command(run, 2), quickDone, quickEntry.revision)
          const long = { ...addOf("sleep 5"), arguments: { command: "sleep 5", timeout_ms: 60_000 } }
          expect(commandOf(yield* ask(run, long)).sequence).toBe(3)

          expect(yield* hostBox.next()).toEqual({ _tag: "CancelCommand", run, command: lost.id, sequence: 1 })
          const failed = (yield* entryAt(run, 1)).value
          expect(failed).toMatchObject({ id: lost.id, state: "failed" })
          expect(failed.error).toContain("timeout (300 ms) and a grace of 400 ms")
          // Not before its deadline: ready + timeout + grace.
          expect(Date.parse(failed.ended_at ?? "")).toBeGreaterThanOrEqual(readyAt + 300 + GRACE_MS)
          expect((yield* entryAt(run, 2)).value).toEqual(quickDone)
          expect((yield* entryAt(run, 3)).value.state).toBe("queued")
          const state = yield* actorState(run)
          expect(state.watched_through).toBe(2)
          // The watch waits for the long one's deadline next.
          expect(state.watch_at).toBeGreaterThanOrEqual(readyAt + 60_000 + GRACE_MS)

          // The run goes on; its end cancels the timer with the rest.
          yield* send(run, { _tag: "Succeed", output, at: timestamp(Date.now()) })
          yield* ended(account, run)
          expect((yield* entryAt(run, 1)).value.state).toBe("failed")
          expect((yield* entryAt(run, 3)).value.state).toBe("cancelled")
        }),
      ),
  )
})

describe("run actor: command index", () => {
  it.live(
    "an id whose sequence was claimed by a lost attempt gets that sequence; the state does not grow with commands",
    () =>
      withWorker({}, () =>
        Effect.gen(function* () {
          const { create } = yield* startRun()
          const run = create.id
          for (let i = 0; i < 5; i++) yield* ask(run, addOf(`warm ${i}`))
          const small = JSON.stringify(yield* actorState(run)).length
          for (let i = 0; i < 60; i++) yield* ask(run, addOf(`more ${i}`))
          const after = yield* actorState(run)
          expect(after.next_sequence).toBe(66)
          // Only the numbers' digits may differ: no per-command bookkeeping in the actor's state.
          expect(JSON.stringify(after).length - small).toBeLessThan(8)

          // An earlier attempt of this add claimed sequence 66 and died before the record and the
          // state were written: the add that comes again is given 66, and the next one 67.
          const lost = addOf("lost")
          const { names } = yield* Storage
          const index = yield* Kv.make(names.kv.commands.name, CommandIndex)
          yield* index.create(kvKeys.commandIndex(run, lost.id), { sequence: 66 })
          expect(commandOf(yield* ask(run, lost))).toMatchObject({
            id: lost.id,
            sequence: 66,
            state: "queued",
          })
          expect(commandOf(yield* ask(run, lost))).toMatchObject({ id: lost.id, sequence: 66 })
          expect(commandOf(yield* ask(run, addOf("next")))).toMatchObject({ sequence: 67 })
          // A cancel naming a sequence that holds another command, or one not given yet, is unknown.
          expect(yield* ask(run, { _tag: "CancelCommand", id: lost.id, sequence: 67 })).toEqual({
            unknown: true,
          })
          expect(yield* ask(run, { _tag: "CancelCommand", id: lost.id, sequence: 99 })).toEqual({
            unknown: true,
          })
        }),
      ),
  )
})

describe("run actor: fresh command ids", () => {
  const views = Effect.gen(function* () {
    const { names } = yield* Storage
    return {
      index: yield* Kv.make(names.kv.commands.name, CommandIndex),
      records: yield* Kv.make(names.kv.commands.name, CommandRecord),
    }
  })

  it.live(
    "a fresh add has its index entry and record stored before it answers; a re-run after a lost state write answers the same record; a record left by a lost message is replaced",
    () =>
      withWorker({}, () =>
        Effect.gen(function* () {
          const { index, records } = yield* views
          const { account, create } = yield* startRun()
          const run = create.id
          const first = { ...addOf("one"), fresh: true }
          const one = commandOf(yield* ask(run, first))
          expect(one).toEqual(queuedOf(first, run, 1))
          // Both written before the answer: the id is found through its index entry.
          expect(Option.getOrThrow(yield* index.get(kvKeys.commandIndex(run, first.id))).value).toEqual({
            sequence: 1,
          })
          expect(Option.getOrThrow(yield* records.get(kvKeys.command(run, 1))).value).toEqual(one)

          // An earlier run of this message wrote both and lost its state write (the state still
          // says 2 is next): the same record answers, written once, and the next add gets 3.
          const again = { ...addOf("again"), fresh: true }
          yield* index.create(kvKeys.commandIndex(run, again.id), { sequence: 2 })
          const before = queuedOf(again, run, 2) as CommandRecord
          const revision = yield* records.create(kvKeys.command(run, 2), before)
          expect(commandOf(yield* ask(run, again))).toEqual(before)
          expect(Option.getOrThrow(yield* records.get(kvKeys.command(run, 2))).revision).toBe(revision)
          expect(commandOf(yield* ask(run, { ...addOf("three"), fresh: true })).sequence).toBe(3)

          // A message that wrote sequence 4 for another id and was lost: a fresh add given 4
          // replaces that record with its own.
          const strayId = makeId("cmd") as CommandId
          yield* records.create(kvKeys.command(run, 4), {
            ...before,
            id: strayId,
            sequence: 4,
          } as CommandRecord)
          const fourth = { ...addOf("four"), fresh: true }
          expect(commandOf(yield* ask(run, fourth))).toMatchObject({ id: fourth.id, sequence: 4 })
          expect(Option.getOrThrow(yield* records.get(kvKeys.command(run, 4))).value.id).toBe(fourth.id)
          expect((yield* actorState(run)).next_sequence).toBe(5)

          // Ended: a fresh add writes nothing and answers ended.
          yield* send(run, {
            _tag: "Fail",
            failure: "infrastructure",
            detail: "test",
            at: timestamp(Date.now()),
          })
          yield* ended(account, run)
          const late = { ...addOf("late"), fresh: true }
          expect(yield* ask(run, late)).toEqual({ ended: true })
          expect(Option.isNone(yield* index.get(kvKeys.commandIndex(run, late.id)))).toBe(true)
          expect(Option.isNone(yield* records.get(kvKeys.command(run, 5)))).toBe(true)
        }),
      ),
  )
})

describe("run actor: billing", () => {
  it.live(
    "charges minute 1 at start, each started minute as the run goes, the rest at the end; once each",
    () =>
      // Real minutes: the run started 2.5 minutes ago, so the minute timer is due at once and the next
      // one is 30 seconds away, while the end (in 1.6 minutes) comes right after.
      withWorker({}, () =>
        Effect.gen(function* () {
          const startedAt = Date.now() - 150_000
          const { account, create } = yield* startRun({ created_at: timestamp(startedAt - 1_000) })
          const run = create.id
          yield* send(run, { _tag: "Started", host: "h-bill", at: timestamp(startedAt) })
          // The host agent retries its message (another message id): nothing more is charged.
          yield* send(run, { _tag: "Started", host: "h-bill", at: timestamp(startedAt) })
          yield* eventually(
            Effect.map(actorState(run), (s) => (s.charged_through === 3 ? Option.some(s) : Option.none())),
            "30 seconds",
            "minutes 2-3 to be charged",
          )
          const endAt = startedAt + 4 * 60_000 + 6_000
          yield* send(run, { _tag: "Succeed", output, at: timestamp(endAt) })
          yield* send(run, { _tag: "Succeed", output, at: timestamp(endAt + 60_000) })
          const done = yield* ended(account, run)
          expect(done.ended_at).toBe(timestamp(endAt))
          expect(done.usage.compute.seconds).toBe(246)
          const entries = yield* eventually(
            Effect.map(computeEntries(account), (es) => (es.length >= 3 ? Option.some(es) : Option.none())),
          )
          expect(entries.map((e) => [e.id, e.from_minute, e.through_minute, e.amount_usd_nanos])).toEqual([
            [derivedId("led", `${run}:1-1`), 1, 1, -price],
            [derivedId("led", `${run}:2-3`), 2, 3, -2 * price],
            [derivedId("led", `${run}:4-5`), 4, 5, -2 * price],
          ])
          expect((yield* Client.balance(account)).balance_usd_nanos).toBe(1_000_000_000 - 5 * price)
          expect(yield* Ledger.sum(account)).toBe(1_000_000_000 - 5 * price)
        }),
      ),
  )

  it.live("a worker dying after its state write or its publish charges nothing twice", () =>
    Effect.gen(function* () {
      const prefix = uniquePrefix()
      const program = Effect.gen(function* () {
        // Dies after storing the end of the run (the final charge not yet published).
        const doomed = yield* startRunWorker(server.url, prefix, {
          run: { minuteMs: 1_000 },
          faults: { crashAt: "afterStateWrite", match: (i) => i.tag === "Succeed" },
        })
        const { account, create } = yield* startRun({ created_at: timestamp(Date.now() - 10_000) })
        const run = create.id
        const startedAt = Date.now() - 5_500
        yield* send(run, { _tag: "Started", host: "h-crash", at: timestamp(startedAt) })
        yield* eventually(
          Effect.map(actorState(run), (s) => (s.charged_through >= 6 ? Option.some(s) : Option.none())),
          "30 seconds",
          "minutes to be charged",
        )
        const endAt = startedAt + 9_500
        yield* send(run, { _tag: "Succeed", output, at: timestamp(endAt) })
        yield* doomed.worker.crashed
        // The next worker finds the stored end and publishes its outbox; it dies after publishing a
        // minute's charge of another run, which is then published again by the third.
        const second = yield* startRunWorker(server.url, prefix, {
          run: { minuteMs: 1_000 },
          faults: { crashAt: "afterPublish", match: (i) => i.tag === "Bill" },
        })
        const done = yield* ended(account, run)
        expect(done.ended_at).toBe(timestamp(endAt))
        const other = yield* startRun({ account })
        yield* send(other.create.id, { _tag: "Started", host: "h-crash", at: timestamp(Date.now()) })
        yield* second.worker.crashed
        const third = yield* startRunWorker(server.url, prefix, { run: { minuteMs: 1_000 } })
        yield* eventually(
          Effect.map(actorState(other.create.id), (s) =>
            s.charged_through >= 3 ? Option.some(s) : Option.none(),
          ),
          "30 seconds",
          "the other run to be charged",
        )
        yield* send(other.create.id, {
          _tag: "Fail",
          failure: "provider",
          detail: "x",
          at: timestamp(Date.now()),
        })
        const otherDone = yield* ended(account, other.create.id)
        const charged = (yield* actorState(other.create.id)).charged_through
        const expectedMinutes = 10 + charged
        const entries = yield* eventually(
          Effect.map(computeEntries(account), (es) =>
            -es.reduce((n, e) => n + e.amount_usd_nanos, 0) === expectedMinutes * price
              ? Option.some(es)
              : Option.none(),
          ),
          "30 seconds",
          "every minute to be charged",
        )
        expect(new Set(entries.map((e) => e.id)).size).toBe(entries.length)
        // Per run the ranges are contiguous from 1 to the minutes charged.
        for (const [id, minutes] of [
          [run, 10],
          [other.create.id, charged],
        ] as const) {
          const ranges = entries
            .filter((e) => e.run === id)
            .map((e) => [e.from_minute!, e.through_minute!] as const)
          expect(ranges[0]![0]).toBe(1)
          for (let i = 1; i < ranges.length; i++) expect(ranges[i]![0]).toBe(ranges[i - 1]![1] + 1)
          expect(ranges.at(-1)![1]).toBe(minutes)
        }
        // At least every minute started before the end (a minute the timer charged a moment before
        // the failure was handled stays charged).
        expect(charged).toBeGreaterThanOrEqual(
          Math.max(
            1,
            Math.ceil((Date.parse(otherDone.ended_at!) - Date.parse(otherDone.started_at!)) / 1_000),
          ),
        )
        const balance = yield* Client.askBalance(account, "20 seconds")
        expect(balance.balance_usd_nanos).toBe(2_000_000_000 - expectedMinutes * price)
        yield* third.stop
        yield* second.stop
        yield* doomed.stop
      })
      return yield* program.pipe(Effect.scoped, Effect.provide(clientLayer(server.url, prefix, fast)))
    }),
  )

  it.live("a minute timer handled late charges the minutes started when it fired, not when handled", () =>
    Effect.gen(function* () {
      const prefix = uniquePrefix()
      const program = Effect.gen(function* () {
        const run = { minuteMs: 2_000 }
        const first = yield* startRunWorker(server.url, prefix, { run })
        const { account, create } = yield* startRun()
        const startedAt = Date.now()
        yield* send(create.id, { _tag: "Started", host: "h-late", at: timestamp(startedAt) })
        yield* eventually(
          Effect.map(actorState(create.id), (s) =>
            s.charged_through === 1 ? Option.some(s) : Option.none(),
          ),
          "30 seconds",
          "minute 1 to be charged",
        )
        // No worker while minute 2's timer fires into the mailbox (2.1 s in) and the host's end
        // (3 s in) lands behind it; a worker gets to both only in minute 3.
        yield* first.stop
        const sleepUntil = (at: number) => Effect.sleep(Math.max(0, at - Date.now()))
        yield* sleepUntil(startedAt + 3_000)
        const endAt = Date.now()
        yield* send(create.id, { _tag: "Succeed", output, at: timestamp(endAt) })
        yield* sleepUntil(startedAt + 4_500)
        const second = yield* startRunWorker(server.url, prefix, { run })
        const done = yield* ended(account, create.id)
        expect(done.ended_at).toBe(timestamp(endAt))
        const minutes = Math.ceil((endAt - startedAt) / 2_000)
        expect(minutes).toBe(2)
        expect((yield* actorState(create.id)).charged_through).toBe(minutes)
        const entries = yield* eventually(
          Effect.map(computeEntries(account), (es) => (es.length >= 2 ? Option.some(es) : Option.none())),
        )
        expect(entries.map((e) => [e.from_minute, e.through_minute])).toEqual([
          [1, 1],
          [2, 2],
        ])
        expect(yield* Ledger.sum(account)).toBe(1_000_000_000 - 2 * price)
        yield* second.stop
      })
      return yield* program.pipe(Effect.scoped, Effect.provide(clientLayer(server.url, prefix, fast)))
    }),
  )

  it.live("an overdraft more than $10 under the minimum stops a running run with credit", () =>
    withWorker({ run: { minuteMs: 500 } }, () =>
      Effect.gen(function* () {
        const { account, create } = yield* startRun()
        const hostBox = yield* inbox(Host, "h-credit")
        yield* send(create.id, { _tag: "Started", host: "h-credit", at: timestamp(Date.now()) })
        yield* eventually(
          Effect.map(computeEntries(account), (es) => (es.length === 1 ? Option.some(es) : Option.none())),
        )
        // Exactly $10 under the minimum (0): the run goes on.
        const balance = (yield* Client.askBalance(account, "20 seconds")).balance_usd_nanos
        yield* Client.adjust(account, "adjustment", -balance - 10_000_000_000)
        // The next minute's charge takes it past $10 under; a check after that stops the run.
        const done = yield* ended(account, create.id)
        expect(done).toMatchObject({ state: "failed", failure: "credit", detail: details.credit })
        expect(yield* hostBox.nextWhere(isStop)).toEqual({ _tag: "Stop", run: create.id })
        const charged = (yield* actorState(create.id)).charged_through
        // Minute 2's check still saw exactly $10 under (its own charge was not applied yet).
        expect(charged).toBeGreaterThanOrEqual(3)
        const entries = yield* eventually(
          Effect.map(computeEntries(account), (es) =>
            -es.reduce((n, e) => n + e.amount_usd_nanos, 0) === charged * price
              ? Option.some(es)
              : Option.none(),
          ),
        )
        expect(entries.at(-1)!.through_minute).toBe(charged)
      }),
    ),
  )

  it.live("a suspended account stops its running run with suspended", () =>
    withWorker({ run: { minuteMs: 500 } }, () =>
      Effect.gen(function* () {
        const store = yield* Accounts.make
        const { account: record } = yield* store.createAccount("acme", "owner@example.com")
        const { account, create } = yield* startRun({ account: record.id })
        yield* send(create.id, { _tag: "Started", host: "h-susp", at: timestamp(Date.now()) })
        yield* eventually(
          Effect.map(actorState(create.id), (s) => (s.charged_through >= 2 ? Option.some(s) : Option.none())),
          "30 seconds",
          "a minute charged while active",
        )
        expect(Option.getOrThrow(yield* storedRun(account, create.id)).state).toBe("running")
        yield* store.setState(record.id, "suspended")
        const done = yield* ended(account, create.id)
        expect(done).toMatchObject({ state: "failed", failure: "suspended", detail: details.suspended })
      }),
    ),
  )
})
