import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Option, Schema } from "effect"
import * as Actor from "../../schema/actors/Actor.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import * as Kv from "../Kv.ts"
import { Nats } from "../Nats.ts"
import { Storage } from "../Storage.ts"
import * as Mailbox from "./Mailbox.ts"
import { partitionOf } from "./Partition.ts"
import { ActorSettings } from "./Settings.ts"
import * as State from "./State.ts"
import { eventually, fast, startWorker, withClient as withClientOn } from "./testing/Harness.ts"
import { flaky, overlaps, Recorder, Sink } from "./testing/TestActors.ts"
import type { CrashPoint } from "./Worker.ts"

let server: StartedNatsServer
beforeAll(async () => {
  server = await startNatsServer()
})
afterAll(() => server?.stop())

/** An actor whose stored state differs from its type: a count kept as a string, dates as ISO text. */
const Stamped = Actor.make({
  name: "stamped",
  state: Schema.Struct({
    count: Schema.NumberFromString.pipe(Schema.nonNegative()),
    seen: Schema.Array(Schema.DateFromString),
  }),
  initial: { count: 0, seen: [] },
  message: Schema.Union(
    Schema.TaggedStruct("Stamp", { at: Schema.Number }),
    // Answers a state that does not encode (a negative count).
    Schema.TaggedStruct("Break", {}),
  ),
  reply: Schema.Number,
  handler: (state, message) =>
    Effect.succeed(
      message._tag === "Stamp"
        ? {
            state: { count: state.count + 1, seen: [...state.seen, new Date(message.at)] },
            reply: state.count + 1,
          }
        : { state: { ...state, count: -1 }, reply: -1 },
    ),
})

const actors = [Recorder, Sink, Stamped]

const withClient = <A, E>(body: Parameters<typeof withClientOn<A, E>>[1]) => withClientOn(server.url, body)

const logOf = <A extends typeof Recorder | typeof Sink>(actor: A, id: string, length: number) =>
  eventually(
    Effect.map(State.read(actor, id), (r) =>
      Option.filter(r, (x) => x.state.log.length >= length).pipe(Option.map((x) => x)),
    ),
    "30 seconds",
    `${actor.name}/${id} to log ${length} entries`,
  )

describe("partitionOf", () => {
  it("is stable and in range", () => {
    expect(partitionOf("run_0000000000000000000000000a", 32)).toBe(
      partitionOf("run_0000000000000000000000000a", 32),
    )
    const seen = new Set<number>()
    for (let i = 0; i < 1000; i++) {
      const p = partitionOf(`acc_${i}`, 32)
      expect(p).toBeGreaterThanOrEqual(0)
      expect(p).toBeLessThan(32)
      seen.add(p)
    }
    expect(seen.size).toBe(32)
  })
})

describe("actor worker", () => {
  it.live("delivers 1,000 messages from 4 senders in per-sender order, one handler at a time", () =>
    withClient((prefix) =>
      Effect.gen(function* () {
        const w1 = yield* startWorker(server.url, prefix, actors, fast)
        const w2 = yield* startWorker(server.url, prefix, actors, fast)
        overlaps.count = 0
        yield* Effect.forEach(
          ["s0", "s1", "s2", "s3"],
          (sender) =>
            Effect.forEach(
              Array.from({ length: 250 }, (_, n) => n),
              (n) =>
                Mailbox.send(
                  Recorder,
                  "one",
                  { _tag: "Add", sender, n },
                  { msgId: `${prefix}-${sender}-${n}` },
                ),
              { discard: true },
            ),
          { concurrency: 4, discard: true },
        )
        const record = yield* logOf(Recorder, "one", 1000)
        expect(record.state.log).toHaveLength(1000)
        for (const sender of ["s0", "s1", "s2", "s3"]) {
          const mine = record.state.log
            .filter((e) => e.startsWith(`${sender}:`))
            .map((e) => Number(e.split(":")[1]))
          expect(mine).toEqual(Array.from({ length: 250 }, (_, n) => n))
        }
        expect(overlaps.count).toBe(0)
        yield* w1.stop
        yield* w2.stop
      }),
    ),
  )

  it.live("stores a message sent twice with one msgId once", () =>
    withClient((prefix) =>
      Effect.gen(function* () {
        const w = yield* startWorker(server.url, prefix, actors, fast)
        yield* Mailbox.send(Recorder, "dup", { _tag: "Add", sender: "a", n: 1 }, { msgId: "same" })
        yield* Mailbox.send(Recorder, "dup", { _tag: "Add", sender: "a", n: 1 }, { msgId: "same" })
        yield* Mailbox.send(Recorder, "dup", { _tag: "Add", sender: "a", n: 2 }, { msgId: "other" })
        const record = yield* logOf(Recorder, "dup", 2)
        expect(record.state.log).toEqual(["a:1", "a:2"])
        yield* w.stop
      }),
    ),
  )

  for (const crashAt of [
    "afterStateWrite",
    "afterPublish",
    "afterAck",
  ] as const satisfies ReadonlyArray<CrashPoint>) {
    it.live(
      `a worker killed ${crashAt} changes nothing: state and outgoing messages as if it had not died`,
      () =>
        withClient((prefix) =>
          Effect.gen(function* () {
            const doomed = yield* startWorker(server.url, prefix, actors, fast, {
              crashAt,
              match: (info) => info.tag === "Forward" && info.id === "fw" && info.seq >= 3,
            })
            for (let n = 1; n <= 5; n++) {
              yield* Mailbox.send(Recorder, "fw", { _tag: "Forward", to: "out", n }, { msgId: `fw-${n}` })
            }
            yield* doomed.worker.crashed
            yield* doomed.stop
            const next = yield* startWorker(server.url, prefix, actors, fast)
            const record = yield* logOf(Recorder, "fw", 5)
            const sink = yield* logOf(Sink, "out", 5)
            // Give a wrongly duplicated forward time to show up before checking there is none.
            yield* Mailbox.send(Sink, "out", { _tag: "Add", sender: "end", n: 0 }, { msgId: "end" })
            const final = yield* logOf(Sink, "out", 6)
            expect(record.state.log).toEqual(["fwd:1", "fwd:2", "fwd:3", "fwd:4", "fwd:5"])
            expect(sink.state.log.slice(0, 5)).toEqual(["fw:1", "fw:2", "fw:3", "fw:4", "fw:5"])
            expect(final.state.log).toEqual(["fw:1", "fw:2", "fw:3", "fw:4", "fw:5", "end:0"])
            yield* next.stop
          }),
        ),
    )
  }

  for (const queued of [false, true]) {
    it.live(
      `retries a retryable failure in order, records a terminal one, and survives a defect${queued ? " (all queued before the worker starts: one group)" : ""}`,
      () =>
        withClient((prefix) =>
          Effect.gen(function* () {
            const start = startWorker(server.url, prefix, actors, fast)
            const early = queued ? undefined : yield* start
            flaky.set(`${prefix}-k`, 2)
            const send = (n: number, message: Parameters<typeof Mailbox.send<typeof Recorder>>[2]) =>
              Mailbox.send(Recorder, "err", message, { msgId: `err-${n}` })
            yield* send(1, { _tag: "Add", sender: "x", n: 1 })
            yield* send(2, { _tag: "Flaky", key: `${prefix}-k` })
            yield* send(3, { _tag: "Add", sender: "x", n: 2 })
            yield* send(4, { _tag: "Fail", key: "t" })
            yield* send(5, { _tag: "Defect" })
            yield* send(6, { _tag: "Add", sender: "x", n: 3 })
            const w = early ?? (yield* start)
            const record = yield* logOf(Recorder, "err", 4)
            expect(record.state.log).toEqual(["x:1", `flaky:${prefix}-k`, "x:2", "x:3"])
            expect(flaky.get(`${prefix}-k`)).toBe(0)
            expect(record.failures).toBe(2)
            expect(record.failure?.message).toContain("a bug in the handler")
            yield* w.stop
          }),
        ),
    )
  }

  it.live(
    "cancelling every timer an actor has is one purge; a timer never set costs none; with one kept, or one set beside, each is purged alone",
    () =>
      withClient((prefix) =>
        Effect.gen(function* () {
          const { connection, jsm } = yield* Nats
          const { names } = yield* Storage
          const { partitions } = yield* ActorSettings.Tag
          // The purges asked of the server, by the subject each removes.
          const purges: Array<string> = []
          const watch = connection.subscribe("$JS.API.STREAM.PURGE.>", {
            callback: (_e, m) => {
              purges.push(String(JSON.parse(m.string()).filter))
            },
          })
          const w = yield* startWorker(server.url, prefix, actors, fast)
          // What is cancelled is set far off (gone from the stream, it can only have been purged);
          // what should fire, soon.
          const [soon, later] = [Date.now() + 2_000, Date.now() + 10 * 60_000]
          const set = (id: string, name: string, at = later) =>
            Mailbox.send(Recorder, id, { _tag: "SetTimer", name, n: 1, at }, { msgId: `${id}-set-${name}` })
          const timersOf = (id: string, count: number) =>
            eventually(
              Effect.map(State.read(Recorder, id), (r) =>
                Option.filter(r, (x) => Object.keys(x.timers).length === count),
              ),
              "10 seconds",
              `${id} to hold ${count} timers`,
            )
          for (const name of ["a", "b", "c"]) yield* set("all", name)
          for (const name of ["a", "b"]) yield* set("some", name)
          yield* set("some", "c", soon)
          for (const name of ["a", "b"]) yield* set("beside", name)
          yield* timersOf("all", 3)
          yield* timersOf("some", 3)
          yield* timersOf("beside", 2)
          // Setting a timer purges nothing (a later schedule replaces an earlier one on the server).
          expect(purges).toEqual([])
          const cancel = (id: string, list: ReadonlyArray<string>, also?: string) =>
            Mailbox.send(
              Recorder,
              id,
              {
                _tag: "CancelTimers",
                names: list,
                ...(also === undefined ? {} : { set: { name: also, n: 2, at: soon } }),
              },
              { msgId: `${id}-cancel` },
            )
          yield* cancel("all", ["a", "never", "b", "c"])
          yield* cancel("some", ["a", "never", "b"])
          yield* cancel("beside", ["a", "b"], "c")
          yield* timersOf("all", 0)
          yield* timersOf("some", 1)
          // The schedules cancelled are gone from the stream: purged (they were not due).
          const storedTimers = (id: string) =>
            Effect.map(
              Effect.promise(() =>
                jsm.streams.info(names.streams.MAILBOX.name, {
                  subjects_filter: names.subjects.timers(Recorder.name, partitionOf(id, partitions), id),
                }),
              ),
              (info) => Object.keys(info.state.subjects ?? {}).sort(),
            )
          const timerOf = (id: string, name: string) =>
            names.subjects.timer(Recorder.name, partitionOf(id, partitions), id, name)
          const storedBecomes = (id: string, expected: ReadonlyArray<string>) =>
            eventually(
              Effect.map(storedTimers(id), (left) =>
                JSON.stringify(left) === JSON.stringify(expected) ? Option.some(left) : Option.none(),
              ),
              "10 seconds",
              `the stored schedules of ${id} to be ${JSON.stringify(expected)}`,
            )
          yield* storedBecomes("all", [])
          yield* storedBecomes("some", [timerOf("some", "c")])
          yield* storedBecomes("beside", [timerOf("beside", "c")])
          // What was kept, or set beside the cancels, fires.
          const fired = (id: string) =>
            eventually(
              Effect.map(State.read(Recorder, id), (r) => Option.filter(r, (x) => x.state.fired.length > 0)),
              "10 seconds",
              `a timer of ${id} to fire`,
            )
          expect((yield* fired("some")).state.fired.map((f) => f.name)).toEqual(["c"])
          expect((yield* fired("beside")).state.fired.map((f) => `${f.name}:${f.n}`)).toEqual(["c:2"])
          expect([...purges].sort()).toEqual(
            [
              names.subjects.timers(Recorder.name, partitionOf("all", partitions), "all"),
              timerOf("some", "a"),
              timerOf("some", "b"),
              timerOf("beside", "a"),
              timerOf("beside", "b"),
            ].sort(),
          )
          watch.unsubscribe()
          yield* w.stop
        }),
      ),
  )

  it.live(
    "messages that queued up for an actor are applied as one group with one write; a crash after it changes nothing",
    () =>
      withClient((prefix) =>
        Effect.gen(function* () {
          const count = 30
          for (let n = 1; n <= count; n++) {
            yield* Mailbox.send(Recorder, "grp", { _tag: "Forward", to: "grp-out", n }, { msgId: `grp-${n}` })
          }
          // The first worker applies what waited and dies right after the first write that holds
          // several messages: that group is neither acked nor forwarded. (The very first delivery
          // may come alone, before the rest reach the worker; the ones queued behind it meanwhile
          // form a group.)
          let group = 0
          const doomed = yield* startWorker(server.url, prefix, actors, fast, {
            crashAt: "afterStateWrite",
            match: (info) => {
              if (info.id !== "grp" || info.group < 2) return false
              group = info.group
              return true
            },
          })
          yield* Effect.raceFirst(
            doomed.worker.crashed,
            logOf(Recorder, "grp", count).pipe(
              Effect.andThen(Effect.dieMessage("every message was applied alone, none as a group")),
            ),
          )
          yield* doomed.stop
          const written = Option.getOrThrow(yield* State.read(Recorder, "grp"))
          // The group is in the one write the worker made before dying, its sends still pending.
          expect(group).toBeGreaterThan(1)
          expect(written.state.log.length).toBeGreaterThanOrEqual(group)
          expect(written.outbox.filter((e) => e._tag === "Send")).toHaveLength(group)

          const next = yield* startWorker(server.url, prefix, actors, fast)
          const expected = Array.from({ length: count }, (_, i) => i + 1)
          const record = yield* logOf(Recorder, "grp", count)
          expect(record.state.log).toEqual(expected.map((n) => `fwd:${n}`))
          yield* logOf(Sink, "grp-out", count)
          yield* Mailbox.send(Sink, "grp-out", { _tag: "Add", sender: "end", n: 0 }, { msgId: "grp-end" })
          const sink = yield* logOf(Sink, "grp-out", count + 1)
          expect(sink.state.log).toEqual([...expected.map((n) => `grp:${n}`), "end:0"])
          yield* next.stop
        }),
      ),
  )

  it.live(
    "the state is stored in its encoded form and read back decoded; one that does not encode fails its message and leaves the state as it was",
    () =>
      withClient((prefix) =>
        Effect.gen(function* () {
          const w = yield* startWorker(server.url, prefix, actors, fast)
          const ask = (message: typeof Stamped.message.Type) =>
            Mailbox.ask(Stamped, "s1", message, { timeout: "10 seconds" })
          expect(yield* ask({ _tag: "Stamp", at: Date.UTC(2026, 0, 1) })).toBe(1)
          // Several at once: applied as one group or more, each answered.
          const counts = yield* Effect.forEach(
            [2, 3, 4],
            (day) => ask({ _tag: "Stamp", at: Date.UTC(2026, 0, day) }),
            { concurrency: "unbounded" },
          )
          expect([...counts].sort()).toEqual([2, 3, 4])
          const broken = yield* ask({ _tag: "Break" }).pipe(Effect.flip)
          expect(broken).toMatchObject({ _tag: "AskFailed", tag: "ParseError" })
          expect(yield* ask({ _tag: "Stamp", at: Date.UTC(2026, 0, 5) })).toBe(5)

          // The bytes in the bucket: the state's encoding (what its schema encodes to).
          const { names } = yield* Storage
          const raw = yield* Kv.make(names.kv.actors.name, Schema.Unknown)
          const stored = Option.getOrThrow(yield* raw.get(kvKeys.actor("stamped", "s1"))).value as {
            state: { count: unknown; seen: Array<unknown> }
          }
          expect(stored.state.count).toBe("5")
          expect(stored.state.seen).toHaveLength(5)
          expect(stored.state.seen[0]).toBe("2026-01-01T00:00:00.000Z")
          // Read back as the type.
          const read = Option.getOrThrow(yield* State.read(Stamped, "s1"))
          expect(read.state.count).toBe(5)
          expect(read.state.seen.map((d) => d.toISOString().slice(0, 10))).toEqual([
            "2026-01-01",
            ...[...counts].sort().map((c) => `2026-01-0${c}`),
            "2026-01-05",
          ])
          expect(read.failures).toBe(1)
          yield* w.stop
        }),
      ),
  )

  it.live(
    "a group whose last state does not encode is applied again message by message: the one that broke it fails alone",
    () =>
      withClient((prefix) =>
        Effect.gen(function* () {
          // Queued before any worker runs, so they arrive together: the group's last state is
          // encoded once, fails, and the group is applied again checking each message's state.
          for (let n = 1; n <= 10; n++)
            yield* Mailbox.send(
              Stamped,
              "s2",
              n === 10 ? { _tag: "Break" } : { _tag: "Stamp", at: Date.UTC(2026, 0, n) },
              { msgId: `s2-${n}` },
            )
          let breakGroup = 0
          const w = yield* startWorker(server.url, prefix, actors, fast, {
            crashAt: "afterStateWrite",
            match: (info) => {
              // The failed message's tag is `invalid` (its state did not encode).
              if (info.id === "s2" && info.seq === 10) breakGroup = info.group
              return false
            },
          })
          const read = yield* eventually(
            Effect.map(
              State.read(Stamped, "s2"),
              Option.filter((r) => r.seq >= 10),
            ),
            "30 seconds",
            "stamped/s2 to take all 10 messages",
          )
          expect(breakGroup).toBeGreaterThan(1)
          expect(read.state.count).toBe(9)
          expect(read.failures).toBe(1)
          expect(read.failure).toMatchObject({ tag: "ParseError" })
          expect(read.state.seen.map((d) => d.getUTCDate())).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9])
          // It goes on from there.
          const next = yield* Mailbox.ask(
            Stamped,
            "s2",
            { _tag: "Stamp", at: Date.UTC(2026, 0, 11) },
            {
              timeout: "10 seconds",
            },
          )
          expect(next).toBe(10)
          yield* w.stop
        }),
      ),
  )

  it.live("ask is answered by the handler; a timeout or a terminal failure is a typed error", () =>
    withClient((prefix) =>
      Effect.gen(function* () {
        const noWorker = yield* Mailbox.ask(
          Recorder,
          "q",
          { _tag: "Question", x: 1 },
          { timeout: "300 millis" },
        ).pipe(Effect.flip)
        expect(noWorker._tag).toBe("AskTimeout")
        const w = yield* startWorker(server.url, prefix, actors, fast)
        const answer = yield* Mailbox.ask(
          Recorder,
          "q",
          { _tag: "Question", x: 21 },
          { timeout: "10 seconds" },
        )
        expect(answer).toBe(42)
        const failed = yield* Mailbox.ask(
          Recorder,
          "q",
          { _tag: "Fail", key: "no" },
          { timeout: "10 seconds" },
        ).pipe(Effect.flip)
        expect(failed).toMatchObject({ _tag: "AskFailed", tag: "Boom" })
        // Asks that arrive together (and may be applied as one group) each get their own answer.
        const answers = yield* Effect.forEach(
          Array.from({ length: 20 }, (_, x) => x),
          (x) => Mailbox.ask(Recorder, "q", { _tag: "Question", x }, { timeout: "10 seconds" }),
          { concurrency: "unbounded" },
        )
        expect(answers).toEqual(Array.from({ length: 20 }, (_, x) => x * 2))
        yield* w.stop
      }),
    ),
  )
})
