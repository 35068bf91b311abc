/**
 * The host actor and run machines on real storage and real namespace machines (the slim test
 * base). The test plays the scheduler and the run actor: it sends `Place`, `Stop` and
 * `CancelCommand` with `Mailbox.send`, writes `queued` command records into KV `commands`, and
 * reads what the host sends by consuming the run, scheduler and webhook mailbox subjects.
 *
 * The host has room for one size `s` machine, so the runs go one after another; each test ends its
 * run with `Stop` (or the host agent's shutdown) and checks the machine left nothing behind.
 */
import { execFileSync } from "node:child_process"
import { createSecretKey, randomBytes } from "node:crypto"
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { gzipSync } from "node:zlib"
import { Chunk, Effect, Exit, Layer, ManagedRuntime, Option, Redacted, Schema, Scope, Stream } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import { ActorSettings } from "../../core/actors/Settings.ts"
import * as Consumer from "../../core/Consumer.ts"
import * as Functions from "../../core/Functions.ts"
import { derivedId, makeId } from "../../core/Ids.ts"
import * as Keyring from "../../core/Keyring.ts"
import * as Kv from "../../core/Kv.ts"
import * as Links from "../../core/Links.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as Nats from "../../core/Nats.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import * as Seal from "../../core/Seal.ts"
import * as SealStream from "../../core/SealStream.ts"
import * as Secrets from "../../core/Secrets.ts"
import * as Storage from "../../core/Storage.ts"
import { TerminalSettings } from "../../core/TerminalSettings.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import { Host as HostActorDef, type HostMessage } from "../../schema/actors/Host.ts"
import { CommandRecord } from "../../schema/Command.ts"
import type { Version } from "../../schema/Function.ts"
import type { AccountId, BaseName, FunctionId, RunId, UploadId, UserId } from "../../schema/Ids.ts"
import { emptyUsage, StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniqueName, uniquePrefix } from "../../test/harness/names.ts"
import { testVersion } from "../../test/harness/versions.ts"
import { BasesSettings, ensureTestBase } from "../bases/Bases.ts"
import { connect } from "../guest/GuestSession.ts"
import { archive, entry } from "../guest/testing.ts"
import { MachineDriver } from "../machines/MachineDriver.ts"
import { make as namespaceDriver } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, newKeys, testDriverSettings } from "../machines/namespace/testing.ts"
import * as Capacity from "../registry/Capacity.ts"
import { Host } from "../registry/HostSettings.ts"
import * as HostActor from "./HostActor.ts"
import * as RunMachine from "./RunMachine.ts"
import { RunSettings } from "./RunSettings.ts"
import * as WarmPool from "./WarmPool.ts"

const ACC = makeId("acc") as AccountId
const USR = makeId("usr") as UserId
const HOST = makeId("host")
const BUDGET = { vcpus: 1, memory_mib: 2048 }

let server: StartedNatsServer
let runtime: ManagedRuntime.ManagedRuntime<Layer.Layer.Success<ReturnType<typeof services>>, never>
let capacity: Capacity.CapacityService
let hostScope: Scope.CloseableScope
let observerScope: Scope.CloseableScope
let baseName: BaseName
/** Runs placed and not yet stopped: a failed test stops them, so the next one finds room. */
const live = new Set<RunId>()
const seen: Array<{ readonly subject: string; readonly body: Record<string, unknown> }> = []

const services = (url: string, prefix: string) => {
  const sealing = Layer.merge(SealStream.layer, Seal.layer).pipe(
    Layer.provide(Keyring.layer),
    Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
  )
  return Layer.mergeAll(
    Functions.layer,
    Secrets.layer,
    Mailbox.layer,
    Layer.succeed(Links.Links, Links.fromKey(createSecretKey(randomBytes(32)), { base: "http://dl.test" })),
    RunSettings.layer({ logFlushMs: 300, endGraceMs: 10_000 }),
    TerminalSettings.layer({ joinWaitMs: 2_000 }),
    BasesSettings.layer(),
    // Disks promised 16 times over, as every test's machines (other test files make theirs at once).
    Layer.succeed(MachineDriver, namespaceDriver(testDriverSettings)),
  ).pipe(
    Layer.provideMerge(sealing),
    Layer.provideMerge(ActorSettings.layer({})),
    Layer.provideMerge(Storage.layerPrefix(prefix)),
    Layer.provideMerge(Nats.layerUrl(url, "host-actor-test")),
    Layer.orDie,
  )
}

type R = Layer.Layer.Success<ReturnType<typeof services>>
const run = <A, E>(effect: Effect.Effect<A, E, R>) => runtime.runPromise(effect)

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
/** Polls `check` until it gives a value; fails the test after `ms` (a test that cannot finish). */
const until = async <A>(check: () => Promise<A | undefined> | A | undefined, what: string, ms = 60_000) => {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await check()
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

/** The first message seen on a subject ending with `id` whose body has `tag`. */
const message = (id: string, tag: string, where: "run" | "scheduler" | "webhook" = "run") =>
  until(
    () =>
      seen.find(
        (m) =>
          m.subject.includes(`.mb.${where}.`) &&
          m.body._tag === tag &&
          (where === "scheduler" ? m.body.run === id : m.subject.endsWith(`.${id}`)),
      )?.body,
    `${where} ${tag} for ${id}`,
  )
const messages = (id: string, where: "run" | "scheduler") =>
  seen
    .filter(
      (m) =>
        m.subject.includes(`.mb.${where}.`) &&
        (where === "scheduler" ? m.body.run === id : m.subject.endsWith(`.${id}`)),
    )
    .map((m) => m.body)

const send = (message: HostMessage, msgId: string) =>
  run(Mailbox.send(HostActorDef, HOST, message, { msgId }))

const commandsKv = Effect.flatMap(Storage.Storage, (s) => Kv.make(s.names.kv.commands.name, CommandRecord))

/** Publishes a function whose version 1 is `definition` over `testVersion`'s defaults (on the test base). */
const publish = (definition: Partial<Version>) =>
  run(
    Effect.gen(function* () {
      const functions = yield* Functions.Functions
      const id = makeId("fnc") as FunctionId
      yield* functions.create(
        ACC,
        testVersion(id, 1, { base: baseName, ...definition, created_by: USR }),
        "test",
      )
      return id
    }),
  )

/** Stores a `.tar.gz` upload sealed for the account; its id. */
const upload = (tar: Buffer) =>
  run(
    Effect.gen(function* () {
      const { names } = yield* Storage.Storage
      const seal = yield* SealStream.SealStream
      const files = yield* ObjectStore.make(names.objects.files.name)
      const name = makeId("file")
      yield* files.put(name, Stream.make(gzipSync(tar)).pipe(seal.seal(ACC, name)))
      return name as UploadId
    }),
  )

/** Writes run `id` of `fn` into KV `runs` as the run actor would: queued, unless `extra` says more. */
const storeRun = async (id: RunId, fn: FunctionId, extra: Partial<StoredRun> = {}) => {
  const stored = Schema.decodeUnknownSync(StoredRun)({
    id,
    account: ACC,
    function: fn,
    version: 1,
    base: baseName,
    size: "s",
    provider: "none",
    prompt: "",
    state: "queued",
    created_at: new Date().toISOString(),
    created_by: USR,
    usage: emptyUsage("s"),
    memory_mib: 2048,
    timeout_minutes: 10,
    log_parts: 0,
    seq: 1,
    ...extra,
  })
  await run(
    Effect.flatMap(Storage.Storage, (s) =>
      Effect.flatMap(Kv.make(s.names.kv.runs.name, StoredRun), (kv) => kv.put(kvKeys.run(ACC, id), stored)),
    ),
  )
  return stored
}

/** Writes a queued run into KV `runs` (as the run actor would) and places it on the host. */
const place = async (fn: FunctionId, extra: Partial<StoredRun> = {}) => {
  const id = makeId("run") as RunId
  await storeRun(id, fn, extra)
  await send({ _tag: "Place", run: id, account: ACC, size: "s", vcpus: 1, memory_mib: 2048 }, `place:${id}`)
  live.add(id)
  return id
}

/** Writes command `sequence` of `runId` as `queued` (as the run actor's AddCommand does); its id. */
const queue = async (
  runId: RunId,
  sequence: number,
  kind: string,
  args: Record<string, unknown>,
  source: "caller" | "agent" = "caller",
) => {
  const record = Schema.decodeUnknownSync(CommandRecord)({
    id: makeId("cmd"),
    run: runId,
    state: "queued",
    source,
    sequence,
    created_at: new Date().toISOString(),
    kind,
    arguments: args,
  })
  await run(Effect.flatMap(commandsKv, (kv) => kv.create(kvKeys.command(runId, sequence), record)))
  return record.id
}

const record = (runId: RunId, sequence: number) =>
  run(Effect.flatMap(commandsKv, (kv) => kv.get(kvKeys.command(runId, sequence)))).then((o) =>
    Option.isSome(o) ? o.value.value : undefined,
  )
/** The record once it is in one of `states`. */
const recordIn = (runId: RunId, sequence: number, ...states: ReadonlyArray<string>) =>
  until(
    async () => {
      const r = await record(runId, sequence)
      return r !== undefined && states.includes(r.state) ? r : undefined
    },
    `command ${sequence} of ${runId} in ${states.join("|")}`,
  )
const ended = (runId: RunId, sequence: number) =>
  recordIn(runId, sequence, "succeeded", "failed", "cancelled")

/** The opened bytes of a sealed object. */
const openObject = (store: "outputs" | "logs", name: string) =>
  run(
    Effect.gen(function* () {
      const { names } = yield* Storage.Storage
      const seal = yield* SealStream.SealStream
      const found = yield* (yield* ObjectStore.make(names.objects[store].name)).get(name)
      if (Option.isNone(found)) return undefined
      const chunks = yield* Stream.runCollect(found.value.data.pipe(seal.open(ACC, name)))
      return Buffer.concat(Chunk.toReadonlyArray(chunks))
    }),
  )

/** Every line of the run's log parts, in order. */
const logLines = async (runId: RunId) => {
  const parts = messages(runId, "run")
    .filter((m) => m._tag === "LogPart")
    .map((m) => m.n as number)
  const lines: Array<Record<string, unknown>> = []
  for (let n = 1; n <= Math.max(0, ...parts); n++) {
    const part = await openObject("logs", kvKeys.logPart(runId, n))
    expect(part, `log part ${n}`).toBeDefined()
    for (const line of part!.toString("utf8").split("\n")) if (line !== "") lines.push(JSON.parse(line))
  }
  return lines
}

/** Stops the run as the run actor does when it ends, and checks the machine is gone and the room free. */
const stopAndCheck = async (runId: RunId) => {
  await send({ _tag: "Stop", run: runId }, `stop:${runId}`)
  await message(runId, "Freed", "scheduler")
  live.delete(runId)
  expect(await leftovers(runId)).toEqual([])
  expect(await run(capacity.free)).toEqual(BUDGET)
}

const startHost = async () => {
  hostScope = Effect.runSync(Scope.make())
  const layer = HostActor.layer.pipe(
    Layer.provide(WarmPool.layerWith({ machines: 0 })),
    Layer.provide(
      Layer.merge(
        Layer.succeed(Host, {
          id: HOST as never,
          driver: "namespace",
          vcpus: BUDGET.vcpus,
          memoryMib: BUDGET.memory_mib,
        }),
        Layer.succeed(Capacity.Capacity, capacity),
      ),
    ),
  )
  await run(Layer.buildWithScope(layer, hostScope))
}

beforeAll(async () => {
  server = await startNatsServer()
  runtime = ManagedRuntime.make(services(server.url, uniquePrefix()))
  baseName = (await ensureTestBase()).name as BaseName
  capacity = await Effect.runPromise(Capacity.make(BUDGET))
  observerScope = Effect.runSync(Scope.make())
  // Everything the host sends to runs, the scheduler and webhooks.
  await run(
    Effect.gen(function* () {
      const { names } = yield* Storage.Storage
      const stream = names.streams.MAILBOX.name
      for (const type of ["run", "scheduler", "webhook"]) {
        const name = uniqueName(`observe_${type}`)
        yield* Consumer.create(stream, name, {
          filter: `${names.prefix}.mb.${type}.>`,
          ackWaitMs: 30_000,
          maxAckPending: 1000,
        })
        const deliveries = yield* Consumer.consume(stream, name).pipe(Scope.extend(observerScope))
        yield* deliveries.pipe(
          Stream.runForEach((d) =>
            Effect.sync(() => {
              seen.push({ subject: d.subject, body: JSON.parse(new TextDecoder().decode(d.data)) })
              d.ack()
            }),
          ),
          Effect.forkIn(observerScope),
        )
      }
    }),
  )
  await startHost()
}, 15 * 60_000)

afterEach(async () => {
  for (const id of live) {
    live.delete(id)
    await send({ _tag: "Stop", run: id }, `stop:${id}`)
    await message(id, "Freed", "scheduler").catch(() => undefined)
  }
})

afterAll(async () => {
  if (hostScope) await Effect.runPromise(Scope.close(hostScope, Exit.void))
  if (observerScope) await Effect.runPromise(Scope.close(observerScope, Exit.void))
  await runtime?.dispose()
  await server?.stop()
})

describe("HostActor", () => {
  it("places a run, runs its commands in order, checks finish against the manifest, packs the output", async () => {
    const secret = await run(
      Effect.flatMap(Secrets.Secrets, (s) => s.store(ACC, { kind: "env" }, Redacted.make("s3cret"))),
    )
    const fn = await publish({
      setup: ["echo setting up", "echo $GREETING > /workspace/greeting"],
      environment: [
        { name: "GREETING", value: "hello" },
        { name: "TOKEN", secret_id: secret },
      ],
      input_manifest: [{ path: "data.txt", max_bytes: 100 }],
      output_manifest: [
        { path: "result.txt", max_bytes: 100 },
        { path: "logs/", max_bytes: 100 },
      ],
    })
    const input = await upload(archive(entry("data.txt", "0", Buffer.from("payload\n"))))
    const a = await place(fn, { input, webhook: "https://hooks.test/a" })
    const started = await message(a, "Started")
    expect(started).toMatchObject({ host: HOST })
    expect(await message(a, "Placed", "scheduler")).toMatchObject({ host: HOST })

    // The host is full: a second run is refused; a placement of an unknown run is dropped (it is
    // handled before the refusal, in mailbox order, and sends nothing).
    const unknown = makeId("run") as RunId
    await send(
      { _tag: "Place", run: unknown, account: ACC, size: "s", vcpus: 1, memory_mib: 2048 },
      `place:${unknown}`,
    )
    const b = await place(fn)
    expect(await message(b, "Refused", "scheduler")).toMatchObject({ run: b, host: HOST })
    expect(messages(b, "run")).toEqual([])
    expect(seen.filter((m) => JSON.stringify(m).includes(unknown))).toEqual([])

    await message(a, "Ready")
    const c1 = await queue(a, 1, "bash", {
      command: "echo $TOKEN $GREETING; cat /workspace/in/data.txt /workspace/greeting",
    })
    await queue(a, 2, "bash", { command: "echo two" }, "agent")
    await queue(a, 3, "finish", { state: "succeeded" })
    const first = await ended(a, 1)
    expect(first).toMatchObject({
      id: c1,
      state: "succeeded",
      result: { exit_code: 0, output: "s3cret hello\npayload\nhello\n" },
    })
    const second = await ended(a, 2)
    expect(second).toMatchObject({ state: "succeeded", result: { exit_code: 0, output: "two\n" } })
    expect(first.started_at! <= second.started_at!).toBe(true)

    // Finish while the output does not match: the problems are the answer, the run goes on.
    const problems = await ended(a, 3)
    expect(problems).toMatchObject({
      state: "succeeded",
      result: { accepted: false, problems: ["result.txt: missing", "logs/: folder missing"] },
    })

    await queue(a, 4, "write", { file_path: "out/result.txt", content: "42\n" })
    await queue(a, 5, "bash", { command: "mkdir -p out/logs && echo x > out/logs/a.log" })
    // Commands run concurrently once started: wait for these before reading what they wrote.
    expect(await ended(a, 4)).toMatchObject({ state: "succeeded", result: { bytes: 3 } })
    expect(await ended(a, 5)).toMatchObject({ state: "succeeded", result: { exit_code: 0 } })
    await queue(a, 6, "get", { path: "out/result.txt" })
    await queue(a, 7, "terminal", {
      rows: 24,
      cols: 80,
      public_key: Buffer.concat([Buffer.from([4]), randomBytes(64)]).toString("base64url"),
    })
    await queue(a, 8, "finish", { state: "succeeded", detail: "all done" })
    expect(await ended(a, 6)).toMatchObject({
      state: "succeeded",
      result: { download_url: expect.stringMatching(/^http:\/\/dl\.test\/v1\/downloads\/files\/cmd_/) },
    })
    // A public key that is not a point of the curve: refused, naming the field.
    expect(await ended(a, 7)).toMatchObject({ state: "failed", error: "public_key: is not a point of P-256" })
    expect(await ended(a, 8)).toMatchObject({ state: "succeeded", result: { accepted: true } })
    const succeed = await message(a, "Succeed")
    expect(succeed).toMatchObject({
      message: "all done",
      output: {
        object: a,
        file_count: 3,
        files: [
          { path: "logs", bytes: 0, dir: true },
          { path: "logs/a.log", bytes: 2, dir: false },
          { path: "result.txt", bytes: 3, dir: false },
        ],
      },
    })

    // The output object opens for the account and holds the files.
    const archived = await openObject("outputs", a)
    const dir = await mkdtemp(join(tmpdir(), "hangar-output-"))
    try {
      await writeFile(join(dir, "out.tar.gz"), archived!)
      execFileSync("tar", ["-xzf", join(dir, "out.tar.gz"), "-C", dir])
      expect(await readFile(join(dir, "result.txt"), "utf8")).toBe("42\n")
      expect(await readFile(join(dir, "logs/a.log"), "utf8")).toBe("x\n")
    } finally {
      await rm(dir, { recursive: true, force: true })
    }

    // A caller's command that ended posts `command.finished` to the run's webhook; an agent's does not.
    const hook = await message(derivedId("evt", c1), "Deliver", "webhook")
    expect(hook).toMatchObject({
      account: ACC,
      run: a,
      url: "https://hooks.test/a",
      type: "command.finished",
    })
    expect(JSON.parse(hook.body as string)).toMatchObject({
      id: derivedId("evt", c1),
      type: "command.finished",
      data: { run: a, command: { id: c1, state: "succeeded" } },
    })
    const agentCommand = (await record(a, 2))!.id
    expect(seen.some((m) => m.subject.endsWith(`.${derivedId("evt", agentCommand)}`))).toBe(false)

    await stopAndCheck(a)

    // The log: machine, input, setup with output and status, ready, the agent's tool call, finish, end.
    const lines = await logLines(a)
    expect(lines.map((l) => l.kind)).toEqual(
      expect.arrayContaining(["machine", "input", "setup", "ready", "tool_call", "finish", "end"]),
    )
    expect(lines.filter((l) => l.kind === "setup")).toMatchObject([
      { command: "echo setting up", exit_code: 0, output: "setting up\n" },
      { command: "echo $GREETING > /workspace/greeting", exit_code: 0 },
    ])
    expect(lines.filter((l) => l.kind === "tool_call")).toMatchObject([
      { name: "bash", arguments: { command: "echo two" }, state: "succeeded", result: { output: "two\n" } },
    ])
    expect(lines.every((l) => typeof l.at === "string")).toBe(true)
    expect(JSON.stringify(lines)).not.toContain("s3cret")
  }, 300_000)

  it("cancels a command, fails the run on finish `failed`, and Stop cancels what still runs", async () => {
    const fn = await publish({})
    const d = await place(fn)
    await message(d, "Ready")
    const c1 = await queue(d, 1, "bash", { command: "sleep 100" })
    await queue(d, 2, "bash", { command: "sleep 100" })
    await recordIn(d, 1, "running")
    await send({ _tag: "CancelCommand", run: d, command: c1 as never, sequence: 1 }, `cancel:${c1}`)
    expect(await ended(d, 1)).toMatchObject({
      state: "cancelled",
      started_at: expect.any(String),
      ended_at: expect.any(String),
    })
    await recordIn(d, 2, "running")
    await queue(d, 3, "finish", { state: "failed", detail: "gave up" })
    expect(await ended(d, 3)).toMatchObject({ state: "succeeded", result: { accepted: true } })
    expect(await message(d, "Fail")).toMatchObject({
      failure: "no_submission",
      detail: "finished as failed: gave up",
      message: "gave up",
    })
    await stopAndCheck(d)
    expect(await record(d, 2)).toMatchObject({ state: "cancelled" })
  }, 180_000)

  it("an input holding a link fails the run with `input`", async () => {
    const fn = await publish({ input_manifest: [{ path: "data.txt", max_bytes: 100 }] })
    const input = await upload(
      archive(
        entry("data.txt", "0", Buffer.from("x")),
        entry("link", "2", undefined, { linkname: "/etc/passwd" }),
      ),
    )
    const c = await place(fn, { input })
    expect(await message(c, "Fail")).toMatchObject({
      failure: "input",
      detail: expect.stringContaining('"link": symbolic links are refused'),
    })
    expect(messages(c, "run").some((m) => m._tag === "Ready")).toBe(false)
    await stopAndCheck(c)
  }, 180_000)

  it("a run whose function version is gone fails `infrastructure` and leaves no claimed folder", async () => {
    const fn = await publish({})
    // Failed before any machine was made: the folder the placement claimed goes with the life.
    const gone = await place(fn, { version: 99 })
    expect(await message(gone, "Fail")).toMatchObject({
      failure: "infrastructure",
      detail: `version 99 of function ${fn} is missing`,
    })
    await stopAndCheck(gone)
  }, 180_000)

  it("a setup command exiting 1 fails the run with `setup` and its output", async () => {
    const fn = await publish({ setup: ["echo first", "echo broken >&2; exit 1", "echo never"] })
    const s = await place(fn)
    const fail = await message(s, "Fail")
    expect(fail).toMatchObject({ failure: "setup" })
    expect(fail.detail).toBe("setup command 2 exited 1: echo broken >&2; exit 1\nbroken\n")
    await stopAndCheck(s)
    const setup = (await logLines(s)).filter((l) => l.kind === "setup")
    expect(setup).toMatchObject([
      { command: "echo first", exit_code: 0 },
      { command: "echo broken >&2; exit 1", exit_code: 1 },
    ])
  }, 180_000)

  for (const finishState of ["accepted", "queued"] as const)
    it(`a later life adopts a kept machine: the command the earlier life had ends failed, and its finish (${finishState}) ends the run`, async () => {
      const fn = await publish({})
      await Effect.runPromise(Scope.close(hostScope, Exit.void))
      // The earlier life, by hand: a ready machine kept for a run running on this host, its output
      // written, a command taken (`queued`) and a `finish` either accepted (it died before sending
      // `Succeed`) or still queued (it died before judging it; a finish runs again).
      const id = makeId("run") as RunId
      const keys = newKeys()
      const rootfs = (await ensureTestBase()).rootfs
      const driver = namespaceDriver(testDriverSettings)
      const machine = await Effect.runPromise(
        driver.create({
          id,
          size: "s",
          base: rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
          owner: HOST,
        }),
      )
      live.add(id)
      await Effect.runPromise(
        Effect.scoped(
          Effect.flatMap(connect({ ...machine.ssh, privateKey: keys.client.private }), (g) =>
            g.bash({ command: "echo 42 > /workspace/out/result.txt" }),
          ),
        ),
      )
      const stored = await storeRun(id, fn, {
        state: "running",
        host: HOST,
        started_at: new Date().toISOString(),
        seq: 2,
      })
      await run(RunMachine.keep(machine, stored, keys.client.private))
      await queue(id, 1, "bash", { command: "sleep 100" })
      const finish = await queue(id, 2, "finish", { state: "succeeded", detail: "done" })
      if (finishState === "accepted")
        await run(
          Effect.flatMap(commandsKv, (kv) =>
            Effect.flatMap(kv.get(kvKeys.command(id, 2)), (entry) => {
              const now = new Date().toISOString()
              const ended = {
                ...Option.getOrThrow(entry).value,
                state: "succeeded",
                result: { accepted: true },
              }
              return kv.put(kvKeys.command(id, 2), {
                ...ended,
                started_at: now,
                ended_at: now,
              } as CommandRecord)
            }),
          ),
        )

      await startHost()
      expect(await ended(id, 1)).toMatchObject({ state: "failed", error: RunMachine.RESTARTED_ERROR })
      expect(await ended(id, 2)).toMatchObject({ id: finish, state: "succeeded", result: { accepted: true } })
      expect(await message(id, "Succeed")).toMatchObject({
        message: "done",
        output: { object: id, file_count: 1, files: [{ path: "result.txt", bytes: 3, dir: false }] },
      })
      await stopAndCheck(id)
      expect((await logLines(id)).map((l) => l.kind)).toEqual(expect.arrayContaining(["adopted", "end"]))
    }, 180_000)

  it("a host agent that stops ends its machines and fails their runs `infrastructure`", async () => {
    const fn = await publish({})
    const e = await place(fn)
    await message(e, "Ready")
    await queue(e, 1, "bash", { command: "sleep 100" })
    await recordIn(e, 1, "running")
    await Effect.runPromise(Scope.close(hostScope, Exit.void))
    expect(await message(e, "Fail")).toMatchObject({
      failure: "infrastructure",
      detail: "the host agent stopped",
    })
    expect(await message(e, "Freed", "scheduler")).toMatchObject({ host: HOST })
    live.delete(e)
    expect(await record(e, 1)).toMatchObject({ state: "cancelled" })
    expect(await leftovers(e)).toEqual([])
    expect(await run(capacity.free)).toEqual(BUDGET)
  }, 180_000)
})
