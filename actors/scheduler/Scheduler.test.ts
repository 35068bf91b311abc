/**
 * The scheduler on a real nats-server with real workers (account, run and scheduler actors): runs
 * are created through the run actor as the gateway creates them, hosts are records in KV `hosts`
 * and scripted host agents answering `Place`/`Stop` on their mailbox subjects. Strict first come,
 * first served with a full host, refusals, hosts that go away; and the pure placement rule.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, type Layer, Option, type Scope } from "effect"
import * as Client from "../../core/actors/AccountClient.ts"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import * as State from "../../core/actors/State.ts"
import { clientLayer, eventually, fast } from "../../core/actors/testing/Harness.ts"
import { makeId } from "../../core/Ids.ts"
import { Host } from "../../schema/actors/Host.ts"
import { type Create, Run } from "../../schema/actors/Run.ts"
import { Scheduler, type SchedulerState, schedulerId, type Waiting } from "../../schema/actors/Scheduler.ts"
import { timestamp } from "../../schema/Common.ts"
import type { Size } from "../../schema/Definition.ts"
import type { HostRecord } from "../../schema/Host.ts"
import type { AccountId, BaseName, FunctionId, KeyId, RunId } from "../../schema/Ids.ts"
import { sizes } from "../../schema/Limits.ts"
import type { StoredRun } from "../../schema/Run.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import {
  hostRecord,
  inbox,
  machineOf,
  removeHost,
  scriptedHost,
  startRunWorker,
  storedRun,
  writeHost,
} from "../run/testing.ts"
import { hostGoneDetail, insert, place } from "./Scheduler.ts"

let server: StartedNatsServer
beforeAll(async () => {
  server = await startNatsServer()
})
afterAll(() => server?.stop())

type Env = Layer.Layer.Success<ReturnType<typeof clientLayer>>

const withWorker = <A, E>(body: (prefix: string) => Effect.Effect<A, E, Env | Scope.Scope>) => {
  const prefix = uniquePrefix()
  return Effect.gen(function* () {
    const w = yield* startRunWorker(server.url, prefix, { scheduler: { tickMs: 200, suspectMs: 4_000 } })
    return yield* body(prefix).pipe(Effect.ensuring(w.stop))
  }).pipe(Effect.scoped, Effect.provide(clientLayer(server.url, prefix, fast)))
}

const account = makeId("acc") as AccountId

/** Creates a run of `size` as the gateway does (credit, memory held, `Create` asked). */
const create = (size: Size = "s") =>
  Effect.gen(function* () {
    const message: Create = {
      _tag: "Create",
      id: makeId("run") as RunId,
      account,
      function: makeId("fnc") as FunctionId,
      version: 1,
      base: "debian-bookworm-20250101-0123456789ab" as BaseName,
      size,
      memory_mib: sizes[size].memoryMib,
      provider: "none",
      prompt: "p",
      timeout_minutes: 30,
      created_at: timestamp(Date.now()),
      created_by: makeId("key") as KeyId,
    }
    yield* Client.mayStart(account, message.id, message.memory_mib, 1 << 20, "20 seconds")
    yield* Mailbox.ask(Run, message.id, message, { timeout: "20 seconds" })
    return message.id
  })

const schedulerState = Effect.map(
  State.read(Scheduler, schedulerId),
  Option.match({ onNone: () => undefined, onSome: (r) => r.state }),
)

const schedulerWhere = (f: (s: SchedulerState) => boolean, what: string) =>
  eventually(
    Effect.map(schedulerState, (s) => (s !== undefined && f(s) ? Option.some(s) : Option.none())),
    "30 seconds",
    what,
  )

const runWhere = (run: string, f: (r: StoredRun) => boolean, what: string) =>
  eventually(Effect.map(storedRun(account, run), Option.filter(f)), "30 seconds", what)

/** A host with room, and a run of size `s` placed and started on it; answers the run and the host's inbox. */
const placedOn = (host: string) =>
  Effect.gen(function* () {
    yield* Client.adjust(account, "purchase", 10_000_000_000)
    const hostBox = yield* inbox(Host, host)
    yield* writeHost(hostRecord(host, { vcpus: 4, memory_mib: 16_384 }))
    const run = yield* create("s")
    expect(yield* hostBox.next()).toEqual({
      _tag: "Place",
      run,
      account,
      size: "s",
      vcpus: 1,
      memory_mib: 2048,
    })
    yield* writeHost(hostRecord(host, { vcpus: 4, memory_mib: 16_384 }, [machineOf(run, "s")]))
    yield* Mailbox.send(
      Run,
      run,
      { _tag: "Started", host, at: timestamp(Date.now()) },
      { msgId: `s:${host}` },
    )
    yield* Mailbox.send(Scheduler, schedulerId, { _tag: "Placed", run, host }, { msgId: `p:${host}` })
    yield* schedulerWhere((s) => s.placed[run] === host, "placed")
    return { run, hostBox }
  })

const succeed = (run: string) =>
  Mailbox.send(
    Run,
    run,
    {
      _tag: "Succeed",
      output: { sha256: "0".repeat(64), bytes: 1, file_count: 0, files: [], object: run },
      at: timestamp(Date.now()),
    },
    { msgId: `succeed-${run}` },
  )

const idle = (s: SchedulerState) =>
  s.queue.length === 0 && Object.keys(s.offered).length === 0 && Object.keys(s.placed).length === 0

describe("scheduler", () => {
  it.effect(
    "placement: the oldest run first, on the live host with the most free vCPUs, offers counted",
    () =>
      Effect.sync(() => {
        const waiting = (size: Size, at: number): Waiting => ({
          run: makeId("run", at) as RunId,
          account,
          size,
          vcpus: sizes[size].vcpus,
          memory_mib: sizes[size].memoryMib,
          created_at: timestamp(at),
        })
        const [a, b, c] = [waiting("m", 1_000), waiting("s", 2_000), waiting("l", 3_000)]
        // Inserted out of order: kept in creation order.
        const queue = insert(insert(insert([], c), a), b)
        expect(queue.map((w) => w.run)).toEqual([a.run, b.run, c.run])
        const big = hostRecord("big", { vcpus: 4, memory_mib: 16_384 })
        const small = hostRecord("small", { vcpus: 3, memory_mib: 16_384 })
        const result = place({ queue, offered: {}, placed: {}, room: {}, suspect: {}, draining: [] }, [
          small,
          big,
        ])
        // a (2 vCPUs) → big (4 free); b (1) → small (3 free vs 2 left on big); c (4) fits nowhere.
        expect(result.send.map((o) => [o.id, (o.message as { run: string }).run])).toEqual([
          ["big", a.run],
          ["small", b.run],
        ])
        expect(result.state.queue).toEqual([c])
        expect(Object.keys(result.state.offered).sort()).toEqual([a.run, b.run].sort())
        // An offer the host already lists counts once; one it does not list yet counts against it.
        const listed = hostRecord("big", { vcpus: 4, memory_mib: 16_384 }, [machineOf(a.run, "m")])
        const again = place(
          {
            queue: [c],
            offered: { [a.run]: { host: "big", waiting: a } },
            placed: {},
            room: {},
            suspect: {},
            draining: [],
          },
          [listed],
        )
        expect(again.send).toEqual([])
        const freeBig = place(
          {
            queue: [b],
            offered: { [a.run]: { host: "big", waiting: a } },
            placed: {},
            room: {},
            suspect: {},
            draining: [],
          },
          [big],
        )
        expect(freeBig.send.map((o) => o.id)).toEqual(["big"])
        // A placed run counts the same way: against a record that does not list it yet, once
        // against one that does (a record read from memory may be a moment behind the `Placed`).
        const placedThere = (next: Waiting, hosts: ReadonlyArray<HostRecord>) =>
          place(
            {
              queue: [next],
              offered: {},
              placed: { [a.run]: "big" },
              room: { [a.run]: { vcpus: a.vcpus, memory_mib: a.memory_mib } },
              suspect: {},
              draining: [],
            },
            hosts,
          ).send
        expect(placedThere(c, [big])).toEqual([])
        expect(placedThere(b, [listed]).map((o) => o.id)).toEqual(["big"])
        // A record still listing a run the scheduler freed (its `Freed` came before the record's
        // write): that room is free already. c (4 vCPUs) fits big only with a's 2 given back.
        const behind = hostRecord("big", { vcpus: 4, memory_mib: 16_384 }, [machineOf(a.run, "m")])
        expect(behind.free_vcpus).toBe(2)
        const onBehind = (s: Pick<SchedulerState, "placed" | "room">) =>
          place({ queue: [c], offered: {}, suspect: {}, draining: [], ...s }, [behind]).send.map((o) => [
            o.id,
            (o.message as { run: string }).run,
          ])
        expect(onBehind({ placed: {}, room: {} })).toEqual([["big", c.run]])
        // Still placed there: its room stays taken.
        expect(
          onBehind({
            placed: { [a.run]: "big" },
            room: { [a.run]: { vcpus: a.vcpus, memory_mib: a.memory_mib } },
          }),
        ).toEqual([])
        // A strict queue: c at the head fits nowhere, so b behind it waits although it fits.
        expect(
          place({ queue: [c, b], offered: {}, placed: {}, room: {}, suspect: {}, draining: [] }, [small])
            .send,
        ).toEqual([])
      }),
  )

  it.live("a full host: runs wait in creation order and start as room frees up, the oldest first", () =>
    withWorker(() =>
      Effect.gen(function* () {
        yield* Client.adjust(account, "purchase", 10_000_000_000)
        // Created before any host exists: all four wait.
        const [r1, r2, r3, r4] = [
          yield* create("s"),
          yield* create("m"),
          yield* create("s"),
          yield* create("s"),
        ]
        yield* schedulerWhere((s) => s.queue.length === 4, "four runs waiting")
        // Room for 2 vCPUs: r1 (1) goes; r2 (2) does not fit the 1 left, and r3, r4 wait behind it.
        const host = yield* scriptedHost("h-full", { vcpus: 2, memory_mib: 8_192 })
        yield* runWhere(r1!, (r) => r.state === "running" && r.host === "h-full", "r1 running")
        const waiting = yield* schedulerWhere((s) => s.placed[r1!] === "h-full", "r1 placed")
        expect(waiting.queue.map((w) => w.run)).toEqual([r2, r3, r4])
        expect(yield* host.taken).toEqual([r1])

        yield* succeed(r1!)
        yield* runWhere(r2!, (r) => r.state === "running", "r2 running")
        const afterR1 = yield* schedulerWhere((s) => s.placed[r2!] === "h-full", "r2 placed")
        expect(afterR1.queue.map((w) => w.run)).toEqual([r3, r4])
        expect(yield* host.taken).toEqual([r1, r2])

        yield* succeed(r2!)
        yield* runWhere(r3!, (r) => r.state === "running", "r3 running")
        yield* runWhere(r4!, (r) => r.state === "running", "r4 running")
        expect(yield* host.taken).toEqual([r1, r2, r3, r4])
        yield* succeed(r3!)
        yield* succeed(r4!)
        yield* schedulerWhere(idle, "the scheduler to be idle")
      }),
    ),
  )

  it.live("12 runs on a host with room for 2 all run, in creation order, none lost", () =>
    withWorker(() =>
      Effect.gen(function* () {
        yield* Client.adjust(account, "purchase", 10_000_000_000)
        const host = yield* scriptedHost("h-two", { vcpus: 2, memory_mib: 8_192 })
        const runs: Array<RunId> = []
        for (let i = 0; i < 12; i++) runs.push(yield* create("s"))
        for (const run of runs) {
          yield* runWhere(run, (r) => r.state === "running", `${run} running`)
          yield* succeed(run)
        }
        for (const run of runs) yield* runWhere(run, (r) => r.state === "succeeded", `${run} succeeded`)
        expect(yield* host.taken).toEqual(runs)
        yield* schedulerWhere(idle, "the scheduler to be idle")
      }),
    ),
  )

  it.live("a refused offer goes back to its place and is offered again before younger runs", () =>
    withWorker(() =>
      Effect.gen(function* () {
        yield* Client.adjust(account, "purchase", 10_000_000_000)
        const r1 = yield* create("s")
        const r2 = yield* create("s")
        yield* schedulerWhere((s) => s.queue.length === 2, "two runs waiting")
        // Room for one run; the host refuses its first offer (r1) although it has the room.
        const host = yield* scriptedHost("h-refuse", { vcpus: 1, memory_mib: 16_384 }, 1)
        yield* runWhere(r1, (r) => r.state === "running", "r1 running")
        const state = yield* schedulerWhere((s) => s.placed[r1] !== undefined, "r1 placed")
        expect(state.queue.map((w) => w.run)).toEqual([r2])
        yield* succeed(r1)
        yield* runWhere(r2, (r) => r.state === "running", "r2 running")
        const places = (yield* host.log).flatMap((m) => (m._tag === "Place" ? [m.run] : []))
        expect(places).toEqual([r1, r1, r2])
        expect(yield* host.taken).toEqual([r1, r2])
      }),
    ),
  )

  it.live("a run on a host that stopped beating fails infrastructure", () =>
    withWorker(() =>
      Effect.gen(function* () {
        const { run, hostBox } = yield* placedOn("h-gone")
        // Its last heartbeat 20 seconds ago, and no newer one while the scheduler watches: gone.
        yield* writeHost(
          hostRecord("h-gone", { vcpus: 4, memory_mib: 16_384 }, [machineOf(run, "s")], Date.now() - 20_000),
        )
        // First suspect (the run still stands), then, stale for the whole suspect window, gone.
        yield* schedulerWhere((s) => s.suspect["h-gone"] !== undefined, "the host to be suspect")
        expect(Option.getOrThrow(yield* storedRun(account, run)).state).toBe("running")
        const failed = yield* runWhere(run, (r) => r.state === "failed", "the run to fail")
        expect(failed).toMatchObject({ failure: "infrastructure", detail: hostGoneDetail })
        yield* schedulerWhere(idle, "the scheduler to forget it")
        // The host (should it come back) is told to stop the run.
        expect(yield* hostBox.next()).toEqual({ _tag: "Stop", run })
      }),
    ),
  )

  it.live(
    "a heartbeat that looks stale only because NATS stood still (the host beats again) fails nothing",
    () =>
      withWorker(() =>
        Effect.gen(function* () {
          const { run } = yield* placedOn("h-frozen")
          // What a NATS server back from a 15 s freeze shows: the host's last heartbeat is old...
          yield* writeHost(
            hostRecord(
              "h-frozen",
              { vcpus: 4, memory_mib: 16_384 },
              [machineOf(run, "s")],
              Date.now() - 20_000,
            ),
          )
          yield* schedulerWhere((s) => s.suspect["h-frozen"] !== undefined, "the host to be suspect")
          // ...and the host, alive all along, beats again within the suspect window.
          yield* writeHost(hostRecord("h-frozen", { vcpus: 4, memory_mib: 16_384 }, [machineOf(run, "s")]))
          yield* schedulerWhere((s) => s.suspect["h-frozen"] === undefined, "the suspicion to clear")
          // Well past the window: the run is still running and still the host's.
          yield* Effect.sleep("1500 millis")
          expect(Option.getOrThrow(yield* storedRun(account, run)).state).toBe("running")
          expect((yield* schedulerState)?.placed[run]).toBe("h-frozen")
        }),
      ),
  )

  it.live("an offer to a host that went away goes back to the queue and to another host", () =>
    withWorker(() =>
      Effect.gen(function* () {
        yield* Client.adjust(account, "purchase", 10_000_000_000)
        const goneBox = yield* inbox(Host, "h-away")
        yield* writeHost(hostRecord("h-away", { vcpus: 4, memory_mib: 16_384 }))
        const run = yield* create("s")
        expect(yield* goneBox.next()).toMatchObject({ _tag: "Place", run })
        yield* removeHost("h-away")
        yield* schedulerWhere((s) => s.queue.some((w) => w.run === run), "the run back in the queue")
        const other = yield* scriptedHost("h-other", { vcpus: 4, memory_mib: 16_384 })
        const running = yield* runWhere(run, (r) => r.state === "running", "running elsewhere")
        expect(running.host).toBe("h-other")
        expect(yield* other.taken).toEqual([run])
        // The gone host's late answer changes nothing.
        yield* Mailbox.send(
          Scheduler,
          schedulerId,
          { _tag: "Placed", run, host: "h-away" },
          { msgId: "late" },
        )
        yield* succeed(run)
        yield* schedulerWhere(idle, "the scheduler to be idle")
      }),
    ),
  )
  it.live(
    "a stale host with room gets no run: the live one with less room does, and runs spread by free room",
    () =>
      withWorker(() =>
        Effect.gen(function* () {
          yield* Client.adjust(account, "purchase", 10_000_000_000)
          // The stale host has the most room but beat 20 s ago: it is never offered anything.
          const staleBox = yield* inbox(Host, "h-stale")
          yield* writeHost(hostRecord("h-stale", { vcpus: 14, memory_mib: 65_536 }, [], Date.now() - 20_000))
          const a = yield* scriptedHost("h-a", { vcpus: 2, memory_mib: 16_384 })
          const b = yield* scriptedHost("h-b", { vcpus: 3, memory_mib: 16_384 })
          const runs = [yield* create("s"), yield* create("s"), yield* create("s"), yield* create("s")]
          for (const run of runs) yield* runWhere(run, (r) => r.state === "running", `${run} running`)
          // Most free vCPUs first: b (3) takes the first, then a and b each hold 2 free, and so on.
          expect((yield* a.taken).length + (yield* b.taken).length).toBe(4)
          expect((yield* a.taken).length).toBe(2)
          expect(yield* staleBox.pending).toEqual([])
          for (const run of runs) yield* succeed(run)
          yield* schedulerWhere(idle, "the scheduler to be idle")
        }),
      ),
  )

  it.live("a drained host takes no new run, its running run goes on; undrained, it takes work again", () =>
    withWorker(() =>
      Effect.gen(function* () {
        yield* Client.adjust(account, "purchase", 10_000_000_000)
        const host = yield* scriptedHost("h-drain", { vcpus: 4, memory_mib: 16_384 })
        const first = yield* create("s")
        yield* runWhere(first, (r) => r.state === "running" && r.host === "h-drain", "first running")
        yield* schedulerWhere((s) => s.placed[first] === "h-drain", "first placed")
        const drained = yield* Mailbox.ask(
          Scheduler,
          schedulerId,
          { _tag: "Drain", host: "h-drain" },
          { timeout: "20 seconds" },
        )
        expect(drained).toEqual({ hosts: [{ host: "h-drain", draining: true, runs: [first] }] })
        // Again: the same answer, nothing changes.
        expect(
          yield* Mailbox.ask(
            Scheduler,
            schedulerId,
            { _tag: "Drain", host: "h-drain" },
            { timeout: "20 seconds" },
          ),
        ).toEqual(drained)
        // A run started now waits (the only host is drained), ticks and all; the first goes on.
        const second = yield* create("s")
        yield* schedulerWhere((s) => s.queue.some((w) => w.run === second), "second waiting")
        yield* Effect.sleep("1 second")
        expect(Option.getOrThrow(yield* storedRun(account, second)).state).toBe("queued")
        expect(Option.getOrThrow(yield* storedRun(account, first)).state).toBe("running")
        expect(
          yield* Mailbox.ask(Scheduler, schedulerId, { _tag: "Hosts" }, { timeout: "20 seconds" }),
        ).toEqual({ hosts: [{ host: "h-drain", draining: true, runs: [first] }] })
        // Its run ends: the host holds nothing, and can be stopped.
        yield* succeed(first)
        yield* schedulerWhere((s) => s.placed[first] === undefined, "first freed")
        const undrained = yield* Mailbox.ask(
          Scheduler,
          schedulerId,
          { _tag: "Undrain", host: "h-drain" },
          { timeout: "20 seconds" },
        )
        expect(undrained).toMatchObject({ hosts: [{ host: "h-drain", draining: false }] })
        yield* runWhere(second, (r) => r.state === "running" && r.host === "h-drain", "second running")
        expect(yield* host.taken).toEqual([first, second])
        yield* succeed(second)
        yield* schedulerWhere(idle, "the scheduler to be idle")
      }),
    ),
  )
})
