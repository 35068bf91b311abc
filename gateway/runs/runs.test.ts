/**
 * Runs started and read through HTTP against the whole stack with the real account, run and
 * scheduler actors, and no host agent: runs stay queued unless a test ends them by sending the run
 * actor the message a host agent would (`Fail`, `Succeed` with an output it stored, `LogPart`).
 * Covers the accepted boundaries of the start body, what a start resolves, memory holds up to the
 * limit, listing and paging with many runs and every filter, run-key scope, and fresh links.
 */
import { createHash, randomBytes } from "node:crypto"
import { Effect, Layer, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as AccountClient from "../../core/actors/AccountClient.ts"
import { Mailbox } from "../../core/actors/Mailbox.ts"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import * as SealStream from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import { Run as RunActor } from "../../schema/actors/Run.ts"
import type { RunId } from "../../schema/Ids.ts"
import type { StoredOutput } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import {
  advertiseBase,
  call,
  createAccount,
  credit,
  expectRefused,
  expectStatus,
  getRun,
  type Headers,
  type Json,
  publish,
  runKey,
  type Stack,
  setLimits,
  startRun,
  startRunAnswer,
  startStack,
  type TestAccount,
  upload,
  waitRun,
} from "../../test/harness/Stack.ts"

let stack: Stack

const sealLayer = SealStream.layer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layer, WrappedKeyStore.layerStorage)),
  Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
)

/** Stores `plain` sealed for `account` as a host agent does (object id = name). */
const putObject = (store: "outputs" | "logs", account: string, name: string, plain: Uint8Array) =>
  stack.run(
    Effect.gen(function* () {
      const { names } = yield* Storage
      const seal = yield* SealStream.SealStream
      const os = yield* ObjectStore.make(names.objects[store].name)
      yield* os.put(name, Stream.make(plain).pipe(seal.seal(account, name)))
    }).pipe(Effect.provide(sealLayer)),
  )

const at = () => new Date().toISOString()

/** Sends the run actor a message as a host agent would. */
const tell = (run: string, message: Json, msgId: string) =>
  stack.run(Effect.flatMap(Mailbox, (m) => m.send(RunActor, run, message as never, { msgId })))

const fail = (run: string) =>
  tell(
    run,
    { _tag: "Fail", failure: "no_submission", detail: "finished as failed: test", at: at() },
    `fail:${run}`,
  )

beforeAll(async () => {
  // The log route's wait for a run's last part made ten minutes: a read that waited when it should
  // not would outlast its test.
  stack = await startStack({ noHost: true, settings: { RUN_LOG_WAIT_MS: 600_000 } })
  await advertiseBase(stack, "host_runs_flows")
}, 120_000)

afterAll(async () => {
  const left = await stack?.close()
  expect(left ?? []).toEqual([])
})

describe("starting", () => {
  let a: TestAccount
  let fn: Json
  beforeAll(async () => {
    a = await createAccount(stack, { name: "alpha" })
    fn = await publish(stack, a, { name: "fn", timeout_minutes: 7 })
  })

  it("every field at its largest accepted value: 201 with the run as sent and resolved", async () => {
    const prompt = `${"p".repeat(131_071)}é`
    const reference = `${"é".repeat(127)}ab` // 256 bytes
    const answer = await startRunAnswer(stack, a, fn.function, {
      prompt,
      external_reference: reference,
      webhook: "https://example.com/hooks/run?x=1",
      version: 0,
    })
    expect(answer.status).toBe(201)
    const run = answer.body
    expect(run.id).toMatch(/^run_[0-9a-z]{26}$/)
    expect(run).toMatchObject({
      account: a.id,
      function: fn.function,
      version: 1,
      base: stack.base.name,
      size: "s",
      provider: "none",
      prompt,
      external_reference: reference,
      webhook: "https://example.com/hooks/run?x=1",
      state: "queued",
      usage: { compute: { size: "s", seconds: 0 } },
    })
    expect(run.created_by).toMatch(/^key_/)
    for (const absent of [
      "input",
      "started_at",
      "ended_at",
      "failure",
      "detail",
      "output",
      "memory_mib",
      "seq",
      "log_parts",
    ]) {
      expect(run).not.toHaveProperty(absent)
    }
    expect(await getRun(stack, a, run.id)).toEqual(run)
    // Its memory is held at the account; the webhook key exists for the events to come.
    const state = await stack.run(AccountClient.state(a.id))
    expect(state.holds[run.id]).toBe(2048)
    expect(state.webhook_key).toBeDefined()
    await fail(run.id)
    await waitRun(stack, a, run.id)
  })

  it("version 0 and absent mean the latest; an older version can be named", async () => {
    await call(stack, "POST", `/v1/functions/${fn.function}/versions`, a.admin, {
      system_prompt: "v2",
      provider: "none",
      base: stack.base.name,
      size: "m",
      output_manifest: [{ path: "x" }],
    })
    const latest = await startRun(stack, a, fn.function)
    const zero = await startRun(stack, a, fn.function, { version: 0 })
    const one = await startRun(stack, a, fn.function, { version: 1 })
    expect([latest.version, zero.version, one.version]).toEqual([2, 2, 1])
    expect([latest.size, one.size]).toEqual(["m", "s"])
    for (const r of [latest, zero, one]) await fail(r.id)
  })

  it("input: a complete upload of the account is accepted and shown", async () => {
    const withInput = await publish(stack, a, { name: "in", input_manifest: [{ path: "data.csv" }] })
    const input = await upload(stack, a, Buffer.from("a,b\n"))
    const run = await startRun(stack, a, withInput.function, { input })
    expect(run.input).toBe(input)
    await fail(run.id)
  })

  it("a run key naming the function starts it; the key is the creator", async () => {
    const key = await runKey(stack, a, [fn.function])
    const answer = await startRunAnswer(stack, a, fn.function, {}, key)
    expect(answer.status).toBe(201)
    expect(answer.body.created_by).toMatch(/^key_/)
    await fail(answer.body.id)
  })

  it("a balance one nano above the minimum may start; at the minimum it is 402", async () => {
    const c = await createAccount(stack, { name: "tight", creditUsd: 0 })
    const f = await publish(stack, c, { name: "f" })
    expectRefused(await startRunAnswer(stack, c, f.function), 402, "no_credit")
    await credit(stack, c.id, 1e-9)
    const run = await startRun(stack, c, f.function)
    expect(run.state).toBe("queued")
    await fail(run.id)
    await waitRun(stack, c, run.id)
  })

  it("memory: runs up to exactly the limit start, the next is 429, an ended run frees its share", async () => {
    const c = await createAccount(stack, { name: "memory" })
    const f = await publish(stack, c, { name: "f" })
    await setLimits(stack, c.id, 4096)
    const first = await startRun(stack, c, f.function)
    const second = await startRun(stack, c, f.function)
    expectRefused(await startRunAnswer(stack, c, f.function), 429, "memory_limit")
    expect((await stack.run(AccountClient.state(c.id))).memory_held_mib).toBe(4096)
    await fail(first.id)
    await waitRun(stack, c, first.id)
    const eventually = async () => {
      for (let i = 0; i < 100; i++) {
        if ((await stack.run(AccountClient.state(c.id))).memory_held_mib === 2048) return
        await new Promise((r) => setTimeout(r, 50))
      }
    }
    await eventually()
    const third = await startRun(stack, c, f.function)
    const listed = (await call(stack, "GET", "/v1/runs?state=active", c.admin)).body.runs.map(
      (r: Json) => r.id,
    )
    expect(listed).toEqual([third.id, second.id])
    for (const r of [second, third]) await fail(r.id)
  })
})

describe("listing", () => {
  let l: TestAccount
  let f1: Json
  let f2: Json
  // Newest first.
  let all: Array<Json> = []
  const failedIds = new Set<string>()

  beforeAll(async () => {
    l = await createAccount(stack, { name: "lists", memoryMib: 1_000_000 })
    f1 = await publish(stack, l, { name: "one" })
    f2 = await publish(stack, l, { name: "two" })
    const made: Array<Json> = []
    for (let i = 0; i < 130; i++) made.push(await startRun(stack, l, i % 3 === 0 ? f2.function : f1.function))
    all = made.reverse()
    for (const [i, r] of all.entries()) {
      if (i % 4 === 1) {
        failedIds.add(r.id)
        await fail(r.id)
      }
    }
    for (const id of failedIds) await waitRun(stack, l, id)
  }, 120_000)

  const pages = async (query: string, headers: Headers = l.admin) => {
    const seen: Array<Json> = []
    const sizes: Array<number> = []
    let before: string | undefined
    for (;;) {
      const sep = query === "" ? "?" : `?${query}&`
      const path =
        before === undefined ? `/v1/runs${query === "" ? "" : `?${query}`}` : `/v1/runs${sep}before=${before}`
      const page = expectStatus(await call(stack, "GET", path, headers), 200, path)
      seen.push(...page.runs)
      sizes.push(page.runs.length)
      if (page.next === undefined) break
      expect(page.next).toBe(page.runs.at(-1).id)
      before = page.next
    }
    return { ids: seen.map((r) => r.id), sizes, runs: seen }
  }

  it("newest first, 50 a page, `next` until the last page", async () => {
    const { ids, sizes } = await pages("")
    expect(sizes).toEqual([50, 50, 30])
    expect(ids).toEqual(all.map((r) => r.id))
  })

  it("filters: function, state, and both, across pages", async () => {
    const expectIds = (filter: (r: Json) => boolean) => all.filter(filter).map((r) => r.id)
    expect((await pages(`function=${f1.function}`)).ids).toEqual(expectIds((r) => r.function === f1.function))
    expect((await pages("state=failed")).ids).toEqual(expectIds((r) => failedIds.has(r.id)))
    expect((await pages("state=active")).ids).toEqual(expectIds((r) => !failedIds.has(r.id)))
    expect((await pages("state=succeeded")).ids).toEqual([])
    const both = await pages(`function=${f2.function}&state=failed`)
    expect(both.ids).toEqual(expectIds((r) => r.function === f2.function && failedIds.has(r.id)))
    expect(both.runs.every((r) => r.state === "failed" && r.failure === "no_submission")).toBe(true)
  })

  it("`before` any id (even one not in the account) lists what is older", async () => {
    const middle = all[60].id
    const page = expectStatus(await call(stack, "GET", `/v1/runs?before=${middle}`, l.admin), 200, "before")
    expect(page.runs.map((r: Json) => r.id)).toEqual(all.slice(61, 111).map((r) => r.id))
    const first = expectStatus(
      await call(stack, "GET", "/v1/runs?before=run_00000000000000000000000000", l.admin),
      200,
      "before",
    )
    expect(first).toEqual({ runs: [] })
  })

  it("a run key sees only its functions' runs", async () => {
    const key = await runKey(stack, l, [f2.function])
    expect((await pages(`function=${f2.function}`, key)).ids).toEqual(
      all.filter((r) => r.function === f2.function).map((r) => r.id),
    )
    expectRefused(await call(stack, "GET", `/v1/runs?function=${f1.function}`, key), 403, "key_scope")
    const mine = all.find((r) => r.function === f2.function)
    const theirs = all.find((r) => r.function === f1.function)
    expect((await call(stack, "GET", `/v1/runs/${mine.id}`, key)).status).toBe(200)
    expectRefused(await call(stack, "GET", `/v1/runs/${theirs.id}`, key), 403, "key_scope")
    expectRefused(await call(stack, "GET", `/v1/runs/${theirs.id}/log`, key), 403, "key_scope")
  })

  it("another account sees none of them", async () => {
    const other = await createAccount(stack, { name: "other" })
    expect(expectStatus(await call(stack, "GET", "/v1/runs", other.admin), 200, "list")).toEqual({ runs: [] })
    expectRefused(await call(stack, "GET", `/v1/runs/${all[0].id}`, other.admin), 404, "not_found")
    expectRefused(await call(stack, "GET", `/v1/runs/${all[0].id}/log`, other.admin), 404, "not_found")
    const filtered = await call(stack, "GET", `/v1/runs?function=${f1.function}`, other.admin)
    expect({ status: filtered.status, body: filtered.body }).toEqual({ status: 200, body: { runs: [] } })
  })

  it("an id that is no run id (a KV wildcard, a dot, another prefix) is 404, never 500", async () => {
    const id = all[0].id
    for (const bad of [`${id}.x`, "run_*", "%3E", `fn_${id.slice(4)}`, "x".repeat(300)]) {
      expectRefused(await call(stack, "GET", `/v1/runs/${bad}`, l.admin), 404, "not_found")
      expectRefused(await call(stack, "GET", `/v1/runs/${bad}/log`, l.admin), 404, "not_found")
    }
  })
})

describe("links in answers", () => {
  let a: TestAccount
  let run: Json
  const archive = randomBytes(200_000)
  const logLines = [
    '{"at":"2025-01-01T00:00:00.000Z","kind":"setup","command":"true","exit_code":0}\n',
    '{"at":"2025-01-01T00:00:01.000Z","kind":"tool_call","name":"bash","arguments":{}}\n',
  ]

  beforeAll(async () => {
    a = await createAccount(stack, { name: "links" })
    const fn = await publish(stack, a, { name: "f" })
    run = await startRun(stack, a, fn.function)
    for (const [i, line] of logLines.entries()) {
      await putObject("logs", a.id, kvKeys.logPart(run.id, i + 1), Buffer.from(line))
      await tell(run.id, { _tag: "LogPart", n: i + 1 }, `log:${run.id}:${i + 1}`)
    }
    await putObject("outputs", a.id, run.id, archive)
    const output: StoredOutput = {
      sha256: createHash("sha256").update(archive).digest("hex") as StoredOutput["sha256"],
      bytes: archive.byteLength,
      file_count: 1,
      files: [{ path: "result.txt", bytes: 5, dir: false }],
      object: run.id,
    }
    await tell(run.id, { _tag: "Succeed", output, message: "done", at: at() }, `succeed:${run.id}`)
    await waitRun(stack, a, run.id)
  })

  it("a succeeded run's output.url streams the archive back, valid 15 minutes", async () => {
    const got = await getRun(stack, a, run.id as RunId)
    expect(got.state).toBe("succeeded")
    expect(got.output).toMatchObject({
      bytes: archive.byteLength,
      file_count: 1,
      files: [{ path: "result.txt" }],
    })
    expect(got.output).not.toHaveProperty("object")
    const url = new URL(got.output.url)
    expect(url.origin).toBe(stack.url)
    expect(url.pathname).toBe(`/v1/downloads/outputs/${run.id}`)
    const expires = Number(url.searchParams.get("expires")) * 1000
    expect(expires).toBeGreaterThan(Date.now() + 14 * 60_000)
    expect(expires).toBeLessThanOrEqual(Date.now() + 15 * 60_000 + 1000)
    const res = await fetch(got.output.url)
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("application/gzip")
    expect(
      createHash("sha256")
        .update(Buffer.from(await res.arrayBuffer()))
        .digest("hex"),
    ).toBe(got.output.sha256)
    // The listing signs its links too.
    const listed = (await call(stack, "GET", "/v1/runs", a.admin)).body.runs[0]
    expect((await fetch(listed.output.url)).status).toBe(200)
  })

  it("the log: one link per part, in order, each a JSON-lines part", async () => {
    const log = expectStatus(await call(stack, "GET", `/v1/runs/${run.id}/log`, a.admin), 200, "log")
    expect(log.parts).toHaveLength(2)
    for (const [i, link] of log.parts.entries()) {
      expect(new URL(link).pathname).toBe(`/v1/downloads/logs/${run.id}.${i + 1}`)
      const res = await fetch(link)
      expect(res.headers.get("content-type")).toBe("application/x-ndjson")
      expect(await res.text()).toBe(logLines[i])
    }
  })

  it("an ended run a host took: a log read waits for its last part and answers once it is told", async () => {
    const fn = await publish(stack, a, { name: "h" })
    const took = async () => {
      const endedAt = Date.now()
      const r = await startRun(stack, a, fn.function)
      await tell(
        r.id,
        { _tag: "Started", host: "host_log", at: new Date(endedAt - 60_000).toISOString() },
        `started:${r.id}`,
      )
      await tell(
        r.id,
        { _tag: "Fail", failure: "no_submission", detail: "test", at: new Date(endedAt).toISOString() },
        `fail:${r.id}`,
      )
      await waitRun(stack, a, r.id)
      await putObject("logs", a.id, kvKeys.logPart(r.id, 1), Buffer.from(logLines[0]!))
      return r.id as string
    }
    // Ended just now, its last part not told yet: the read waits, and answers once it is.
    const now = await took()
    let answered: Json | undefined
    const read = call(stack, "GET", `/v1/runs/${now}/log`, a.admin).then((r) => {
      answered = r.body
      return r
    })
    await new Promise((r) => setTimeout(r, 300))
    expect(answered).toBeUndefined()
    await tell(now, { _tag: "LogPart", n: 1, last: true }, `log:${now}:1`)
    expect(expectStatus(await read, 200, "log").parts).toHaveLength(1)
  })

  it("a run without log parts has an empty log", async () => {
    const fn = await publish(stack, a, { name: "g" })
    const fresh = await startRun(stack, a, fn.function)
    expect(expectStatus(await call(stack, "GET", `/v1/runs/${fresh.id}/log`, a.admin), 200, "log")).toEqual({
      parts: [],
    })
    await fail(fresh.id)
  })
})
