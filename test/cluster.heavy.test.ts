/**
 * The distributed shape on one machine, with real processes: a 3-node JetStream cluster
 * (`test/harness/NatsCluster.ts`, the config `deploy/cluster/` documents) with every stream, KV
 * bucket and object store R3, and each role as `hangar serve <role>`: two gateways, two actor
 * workers and three host agents with their own host ids, machines folders, run folders and address
 * pools (`Stack.startExtra`), as three hosts would have. Runs go through both gateways while one
 * nats-server node is SIGKILLed and restarted on its store; every run ends, and every command's
 * effect is there exactly once.
 */
import { randomBytes, randomUUID } from "node:crypto"
import { readdir, stat } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Fiber, Layer, Logger, LogLevel, Option, Schedule, Schema, type Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Kv from "../core/Kv.ts"
import * as Nats from "../core/Nats.ts"
import * as OperatorEvents from "../core/OperatorEvents.ts"
import * as Storage from "../core/Storage.ts"
import { Storage as StorageTag } from "../core/Storage.ts"
import { NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { derivedId } from "../host-agent/registry/HostSettings.ts"
import type { OperatorEvent } from "../schema/OperatorEvent.ts"
import { storageNames } from "../schema/Subjects.ts"
import { clusterLeases, type NatsCluster, startNatsCluster } from "./harness/NatsCluster.ts"
import { uniquePrefix } from "./harness/names.ts"
import { freePort } from "./harness/Ports.ts"
import {
  type Answer,
  call,
  closeStack,
  createAccountPatiently,
  type Json,
  problems,
  publish,
  type Stack,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms))

describe("a 3-node NATS cluster", () => {
  let cluster: NatsCluster

  beforeAll(async () => {
    cluster = await startNatsCluster(3)
  }, 60_000)
  afterAll(() => cluster?.stop(), 60_000)

  it("a role started with fewer nodes up than R3 needs says so and waits, then starts once they are back", async () => {
    const warnings: Array<string> = []
    const logger = Logger.replace(
      Logger.defaultLogger,
      Logger.make(({ logLevel, message }) => {
        if (logLevel._tag === "Warning") warnings.push(String(message))
      }),
    )
    await cluster.nodes[1]!.kill()
    await cluster.nodes[2]!.kill()
    const prefix = uniquePrefix()
    const started = Effect.runPromise(
      Effect.gen(function* () {
        const { names } = yield* Storage.Storage
        const { jsm } = yield* Nats.Nats
        const info = yield* Nats.attempt("info", () => jsm.streams.info(names.streams.EVENTS.name))
        return info.config.num_replicas
      }).pipe(
        Effect.provide(
          Storage.layer.pipe(
            Layer.provideMerge(Nats.layerUrl(cluster.url, "quorum-test")),
            Layer.provide(Storage.StorageSettings.layer({ prefix, replicas: 3 })),
          ),
        ),
        Effect.provide(Layer.merge(logger, Logger.minimumLogLevel(LogLevel.Info))),
        Effect.scoped,
      ),
    )
    let settled = false
    void started.finally(() => {
      settled = true
    })
    const deadline = Date.now() + 30_000
    while (warnings.length === 0 && Date.now() < deadline) await pause(100)
    expect(warnings[0]).toContain("quorum (2 of 3 nodes)")
    expect(settled).toBe(false)
    await cluster.nodes[1]!.restart()
    await cluster.nodes[2]!.restart()
    expect(await started).toBe(3)
  }, 120_000)

  it("an R3 bucket reads back at once, on a connection to any node, what a write acknowledged", async () => {
    const names = storageNames(uniquePrefix())
    const on =
      (url: string) =>
      <A, E>(fx: Effect.Effect<A, E, Nats.Nats | Scope.Scope>) =>
        Effect.runPromise(fx.pipe(Effect.provide(Nats.layerUrl(url, "read-test")), Effect.scoped))
    await on(cluster.url)(Storage.ensureWhenPlaceable(names, { replicas: 3 }))
    const bucket = names.kv.runs.name
    // One writer (on the first node) and a reader on each node, all in one program so the reads
    // follow each acknowledged write at once; big writes beside them keep the followers busy.
    const stale = await on(cluster.nodes[0]!.url)(
      Effect.gen(function* () {
        const kv = yield* Kv.make(bucket, Schema.String)
        const others = yield* Effect.forEach(cluster.nodes, (n) =>
          Effect.map(Layer.build(Nats.layerUrl(n.url, "reader")), (ctx) =>
            Kv.make(bucket, Schema.String).pipe(Effect.provide(ctx)),
          ),
        )
        const views = yield* Effect.all(others)
        const filler = "x".repeat(200_000)
        let missed = 0
        for (let i = 0; i < 50; i++) {
          // The big writes leave first (their fiber runs up to its sends at the yield); the key's
          // write is acknowledged after them, and read while the followers still apply them.
          const busy = yield* Effect.fork(
            Effect.forEach([0, 1, 2, 3, 4], (j) => kv.put(`filler${j}`, filler), {
              concurrency: "unbounded",
              discard: true,
            }),
          )
          yield* Effect.yieldNow()
          yield* kv.put(`k${i}`, `v${i}`)
          for (const view of views) {
            const got = yield* view.get(`k${i}`)
            if (Option.isNone(got) || got.value.value !== `v${i}`) missed++
          }
          yield* Fiber.join(busy)
        }
        return missed
      }),
    )
    expect(stale).toBe(0)
  }, 120_000)

  describe("with every role in its own process, several of each", () => {
    let stack: Stack
    let acct: TestAccount
    let urls: Array<string>

    beforeAll(async () => {
      stack = await startStack({
        processes: true,
        natsUrl: cluster.url,
        hostVcpus: 2,
        minuteMs: 5_000,
        queueTimeoutMs: 600_000,
        settings: { ...clusterLeases, NATS_REPLICAS: 3 },
      })
      const port = await freePort()
      const second = `http://127.0.0.1:${port}`
      await Promise.all([
        stack.startExtra("gateway", { HTTP_ADDR: `127.0.0.1:${port}`, PUBLIC_URL: second }),
        stack.startExtra("actors"),
        ...[1, 2].map((i) =>
          stack.startExtra("host", {
            HOST_ID: derivedId(randomBytes(16).toString("hex"), `${stack.dir}/${i}`),
          }),
        ),
      ])
      urls = [stack.url, second]
      // The second worker takes half of every mailbox partition over in its first seconds; a
      // partition being moved answers nothing meanwhile (an ask sent then may time out: the
      // account's credit once did, on a busy machine), so the account is made and the runs start
      // once both workers hold their halves.
      await stack.run(
        Effect.gen(function* () {
          const { names } = yield* StorageTag
          const leases = yield* Kv.make(names.kv.leases.name, Schema.Struct({ owner: Schema.String }))
          const split = Effect.gen(function* () {
            const keys = yield* leases.keys("p.>")
            const owners = new Map<string, number>()
            for (const key of keys) {
              const lease = yield* leases.get(key)
              if (Option.isSome(lease))
                owners.set(lease.value.value.owner, (owners.get(lease.value.value.owner) ?? 0) + 1)
            }
            const counts = [...owners.values()]
            return counts.length === 2 && counts[0] === counts[1]
          })
          yield* split.pipe(
            Effect.repeat({ until: (done) => done, schedule: Schedule.spaced("500 millis") }),
            Effect.timeoutFail({
              duration: "120 seconds",
              onTimeout: () => new Error("partitions never split"),
            }),
          )
        }),
      )
      // Made again if its credit is not confirmed in time (partitions may still be settling).
      acct = await createAccountPatiently(stack, { creditUsd: 100, memoryMib: 64 * 1024 })
    }, 300_000)

    afterAll(() => closeStack(stack), 120_000)

    it("every stream, KV bucket and object store is R3, read from its leader", async () => {
      const replicas = await stack.run(
        Effect.gen(function* () {
          const { jsm } = yield* Nats.Nats
          const names = storageNames(stack.prefix)
          const all = yield* Nats.attempt("names", async () => {
            const out: Array<string> = []
            for await (const info of jsm.streams.list())
              if (info.config.name.includes(names.prefix))
                out.push(`R${info.config.num_replicas}${info.config.allow_direct ? " direct" : ""}`)
            return out
          })
          return all
        }),
      )
      expect(replicas.length).toBeGreaterThan(10)
      // No direct gets: a follower would answer them with what it has applied so far (`Kv.get`).
      expect(new Set(replicas)).toEqual(new Set(["R3"]))
    })

    it("runs through both gateways all end, each command applied once, while a NATS node is SIGKILLed and restarted", async () => {
      let retried = 0
      const fives: Array<string> = []
      // A client as the spec asks: a creating POST carries an Idempotency-Key and is retried on a
      // connection error, a 503 or a 409 with Retry-After; a 500 is counted (there must be none).
      const post = async (gateway: number, path: string, body: unknown): Promise<Answer> => {
        const headers = { ...acct.admin, "idempotency-key": randomUUID() }
        // Generous: once, under a loaded machine, asks to the actors went unanswered for over 90 s
        // after the node came back (partitions re-reading R3 consumers); what is checked here is
        // that everything ends and nothing is applied twice, not how fast the cluster recovers.
        const deadline = Date.now() + 180_000
        for (let attempt = 0; ; attempt++) {
          const url = urls[(gateway + attempt) % urls.length]!
          const answer = await call({ url }, "POST", path, headers, body).catch(
            (e: unknown): Answer => ({ status: 0, body: undefined, text: String(e), headers: {} }),
          )
          if (answer.status >= 500 && answer.status !== 503)
            fives.push(`${path} ${answer.status} ${answer.text}`)
          const again =
            answer.status === 0 ||
            answer.status === 503 ||
            (answer.status === 409 && answer.headers["retry-after"] !== undefined)
          if (!again || Date.now() > deadline) return answer
          retried++
          await pause(300)
        }
      }
      // A command sent and waited for, through gateway `gateway` (the other one on a retry).
      const command = async (gateway: number, run: string, kind: string, args: Json) => {
        const sent = await post(gateway, `/v1/runs/${run}/commands`, { kind, arguments: args })
        if (sent.status !== 201) {
          const record = await call({ url: urls[0]! }, "GET", `/v1/runs/${run}`, acct.admin)
          throw new Error(
            `${kind} on ${run}: ${sent.status} ${sent.text}; the run: ${record.text}\n${problems(stack)}`,
          )
        }
        const deadline = Date.now() + 90_000
        for (;;) {
          const got = await call(
            { url: urls[gateway]! },
            "GET",
            `/v1/runs/${run}/commands/${sent.body.id}?wait=20`,
            acct.admin,
          ).catch((e: unknown): Answer => ({ status: 0, body: undefined, text: String(e), headers: {} }))
          if (got.status === 200 && ["succeeded", "failed", "cancelled"].includes(got.body.state))
            return got.body
          if (got.status >= 500 && got.status !== 503) fives.push(`GET command ${got.status} ${got.text}`)
          if (Date.now() > deadline)
            throw new Error(`command of ${run} never ended: ${got.status} ${got.text}`)
          if (got.status !== 200) await pause(300)
        }
      }

      const fn = await publish(stack, acct, { timeout_minutes: 60 })
      const count = 6
      const runs: Array<string> = []
      for (let i = 0; i < count; i++) {
        const started = await post(i % 2, `/v1/functions/${fn.function}/runs`, { prompt: "go" })
        expect(started.status, started.text).toBe(201)
        stack.runs.add(started.body.id)
        runs.push(started.body.id)
      }
      const appendLines = (from: number, to: number) =>
        Promise.all(
          runs.map(async (run, i) => {
            for (let n = from; n < to; n++) {
              const ended = await command(i % 2, run, "bash", {
                command: `echo line-${n} >> /workspace/lines`,
              })
              expect(ended.state, JSON.stringify(ended)).toBe("succeeded")
            }
          }),
        )
      await appendLines(0, 2)
      // Each host agent keeps its machines in its own folder (as separate hosts would): every run's
      // machine is in exactly one, and not all in the main host agent's.
      const folders = await Promise.all(
        runs.map(async (run) => {
          const candidates = [
            NamespaceDriverSettings.defaults.machinesDir,
            ...(await readdir("/var/lib/hangar/test-hosts").catch(() => [] as Array<string>))
              .filter((d) => d.startsWith(stack.prefix))
              .map((d) => join("/var/lib/hangar/test-hosts", d)),
          ]
          const holding = []
          for (const dir of candidates)
            if (
              await stat(join(dir, run)).then(
                () => true,
                () => false,
              )
            )
              holding.push(dir)
          return holding
        }),
      )
      for (const holding of folders) expect(holding).toHaveLength(1)
      expect(folders.some(([dir]) => dir !== NamespaceDriverSettings.defaults.machinesDir)).toBe(true)
      // A node goes mid-runs: the lines keep coming while it is gone and as it comes back.
      const node = cluster.nodes[0]!
      await node.kill()
      const during = appendLines(2, 5)
      await pause(8_000)
      await node.restart()
      await during
      await appendLines(5, 6)
      await Promise.all(
        runs.map(async (run, i) => {
          const lines = await command(i % 2, run, "bash", {
            command: "cat /workspace/lines; cp /workspace/lines /workspace/out/result.txt",
          })
          expect(lines.result.output).toBe(Array.from({ length: 6 }, (_, n) => `line-${n}\n`).join(""))
          const finished = await command(i % 2, run, "finish", { state: "succeeded" })
          expect(finished.state).toBe("succeeded")
        }),
      )
      for (const run of runs) {
        const ended = await waitRun(stack, acct, run, { timeoutMs: 60_000 })
        expect(ended, problems(stack)).toMatchObject({ state: "succeeded", output: { file_count: 1 } })
      }
      // Operators saw each state change and each command's end once, on evt.<account>.<run>.
      for (const run of runs) {
        const deadline = Date.now() + 15_000
        let events: ReadonlyArray<OperatorEvent> = []
        for (;;) {
          events = await stack.run(OperatorEvents.stored(acct.id, run))
          if (events.filter((e) => e.type === "command.ended").length >= 8 || Date.now() > deadline) break
          await pause(200)
        }
        expect(events.flatMap((e) => (e.type === "run.state" ? [e.state] : []))).toEqual([
          "queued",
          "running",
          "succeeded",
        ])
        const ends = events.flatMap((e) => (e.type === "command.ended" ? [e] : []))
        expect(ends.map((e) => e.sequence).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8])
        expect(new Set(ends.map((e) => e.state))).toEqual(new Set(["succeeded"]))
      }
      // The runs were spread over the hosts (the run record names the host that took it).
      const hosts = await stack.run(
        Effect.gen(function* () {
          const { names } = yield* StorageTag
          const kv = yield* Kv.make(
            names.kv.runs.name,
            Schema.Struct({ host: Schema.optional(Schema.String) }),
          )
          const seen = new Set<string>()
          for (const run of runs) {
            const entry = yield* kv.get(`${acct.id}.${run}`)
            if (Option.isSome(entry) && entry.value.value.host !== undefined) seen.add(entry.value.value.host)
          }
          return seen
        }),
      )
      console.log(`cluster runs: ${count} succeeded, ${retried} retried requests, on ${hosts.size} hosts`)
      expect(hosts.size).toBeGreaterThanOrEqual(2)
      expect(fives).toEqual([])
    }, 480_000)
  })
})
