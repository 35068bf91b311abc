/**
 * `Idempotency-Key` on the creating routes, through HTTP on the whole stack: a retried request
 * (same key, same body) gets the first answer and creates nothing more; another body is refused;
 * an answer lost to a timeout is found again by the retry instead of made twice.
 */
import { createHash } from "node:crypto"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Mailbox } from "../core/actors/Mailbox.ts"
import { Nats } from "../core/Nats.ts"
import { STALE_CLAIM_MS } from "../gateway/Idempotency.ts"
import { Run } from "../schema/actors/Run.ts"
import {
  type Answer,
  call,
  closeStack,
  createAccount,
  expectRefused,
  expectStatus,
  publish,
  request,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "./harness/Stack.ts"

let stack: Stack
let acct: TestAccount
let fn: string

beforeAll(async () => {
  stack = await startStack()
  acct = await createAccount(stack)
  fn = (await publish(stack, acct)).function
}, 120_000)

afterAll(() => closeStack(stack), 120_000)

const post = (path: string, body: unknown, key: string | undefined, headers = acct.admin): Promise<Answer> =>
  call(stack, "POST", path, { ...headers, ...(key === undefined ? {} : { "idempotency-key": key }) }, body)

const uniqueKey = () => `key-${Math.random().toString(36).slice(2)}`

describe("Idempotency-Key", () => {
  it("a started run retried with the same key and body is the same run, started and billed once", async () => {
    const key = uniqueKey()
    const body = { prompt: "once", external_reference: "ref-1" }
    const first = expectStatus(await post(`/v1/functions/${fn}/runs`, body, key), 201, "start")
    const again = await post(`/v1/functions/${fn}/runs`, body, key)
    expect(again.status).toBe(201)
    expect(again.headers["idempotent-replayed"]).toBe("true")
    expect(again.body.id).toBe(first.id)
    // The same body in another key order is the same request.
    const reordered = await fetch(`${stack.url}/v1/functions/${fn}/runs`, {
      method: "POST",
      headers: { ...acct.admin, "idempotency-key": key, "content-type": "application/json" },
      body: '{"external_reference":"ref-1","prompt":"once"}',
    })
    expect(((await reordered.json()) as { id: string }).id).toBe(first.id)
    const listed = expectStatus(await call(stack, "GET", `/v1/runs?function=${fn}`, acct.admin), 200, "runs")
    expect(listed.runs.filter((r: { prompt?: string; id: string }) => r.id === first.id)).toHaveLength(1)
    expect(
      listed.runs.filter((r: { id: string }) => r.id !== first.id && r.id === again.body.id),
    ).toHaveLength(0)

    // Another body with the same key is refused and starts nothing.
    const before = listed.runs.length
    expectRefused(
      await post(`/v1/functions/${fn}/runs`, { prompt: "twice" }, key),
      409,
      "conflict",
      "idempotency-key",
    )
    const after = expectStatus(await call(stack, "GET", `/v1/runs?function=${fn}`, acct.admin), 200, "runs")
    expect(after.runs.length).toBe(before)
    // Without a key, each start is a new run.
    const a = await startRun(stack, acct, fn, { prompt: "free" })
    const b = await startRun(stack, acct, fn, { prompt: "free" })
    expect(a.id).not.toBe(b.id)
  })

  it("a command and an upload retried with the same key are the same command and upload", async () => {
    const run = (await startRun(stack, acct, fn)).id
    const key = uniqueKey()
    const cmd = {
      kind: "bash",
      arguments: { command: "echo $RANDOM >> /workspace/count; wc -l < /workspace/count" },
    }
    const first = expectStatus(await post(`/v1/runs/${run}/commands`, cmd, key), 201, "command")
    const again = expectStatus(await post(`/v1/runs/${run}/commands`, cmd, key), 201, "command again")
    expect(again.id).toBe(first.id)
    expect(again.sequence).toBe(first.sequence)
    expectRefused(
      await post(`/v1/runs/${run}/commands`, { kind: "bash", arguments: { command: "true" } }, key),
      409,
      "conflict",
      "idempotency-key",
    )
    const list = expectStatus(await call(stack, "GET", `/v1/runs/${run}/commands`, acct.admin), 200, "list")
    expect(list.commands.filter((c: { id: string }) => c.id === first.id)).toHaveLength(1)

    const file = { bytes: 3, sha256: createHash("sha256").update("abc").digest("hex") }
    const upKey = uniqueKey()
    const up1 = expectStatus(await post("/v1/files", file, upKey), 201, "upload")
    const up2 = expectStatus(await post("/v1/files", file, upKey), 201, "upload again")
    expect(up2).toEqual(up1)
    const put = await request(up1.url, { method: "PUT", headers: up1.headers, body: Buffer.from("abc") })
    expect(put.status).toBe(200)
  })

  it("a create that waited answers what it answered again; the same key without the wait is another request", async () => {
    // This file's runs may wait for room on the host: the wait runs out with the command queued.
    const run = (await startRun(stack, acct, fn)).id
    const key = uniqueKey()
    const cmd = { kind: "bash", arguments: { command: "true" } }
    const path = `/v1/runs/${run}/commands?wait=1`
    const first = expectStatus(await post(path, cmd, key), 201, "command with wait")
    const again = await post(path, cmd, key)
    expect(again.headers["idempotent-replayed"]).toBe("true")
    expect(again.status).toBe(201)
    expect(again.body).toEqual(first)
    // The query is part of the request.
    expectRefused(await post(`/v1/runs/${run}/commands`, cmd, key), 409, "conflict", "idempotency-key")
    const list = expectStatus(await call(stack, "GET", `/v1/runs/${run}/commands`, acct.admin), 200, "list")
    expect(list.commands.map((c: { id: string }) => c.id)).toEqual([first.id])
  })

  it("a command's id is fresh to the run actor only without a key, whose retry may carry the same id", async () => {
    const run = (await startRun(stack, acct, fn)).id
    // What the gateway asks of the run actor, seen as it is published to its mailbox.
    const seen = new Map<string, { readonly fresh?: boolean }>()
    const waiting = new Map<string, () => void>()
    const sub = await stack.run(
      Effect.gen(function* () {
        const subject = (yield* Mailbox).subjectOf(Run, run)
        return (yield* Nats).connection.subscribe(subject, {
          callback: (_e, msg) => {
            const m = msg.json<{ _tag: string; id: string; fresh?: boolean }>()
            if (m._tag !== "AddCommand") return
            seen.set(m.id, m)
            waiting.get(m.id)?.()
          },
        })
      }),
    )
    const asked = async (key: string | undefined) => {
      const sent = expectStatus(
        await post(`/v1/runs/${run}/commands`, { kind: "bash", arguments: { command: "true" } }, key),
        201,
        "command",
      )
      if (!seen.has(sent.id)) await new Promise<void>((ok) => waiting.set(sent.id, ok))
      return seen.get(sent.id)!
    }
    try {
      expect((await asked(undefined)).fresh).toBe(true)
      expect((await asked(uniqueKey())).fresh).toBe(false)
    } finally {
      sub.unsubscribe()
    }
  })

  it("a key's token is shown once: the same request again is refused, and no second key is made", async () => {
    const key = uniqueKey()
    const made = expectStatus(
      await post("/v1/keys", { name: "once", scope: "admin" }, key, acct.owner),
      201,
      "key",
    )
    expect(made.token).toMatch(/^hgr_/)
    const again = await post("/v1/keys", { name: "once", scope: "admin" }, key, acct.owner)
    expectRefused(again, 409, "conflict", "idempotency-key")
    expect(again.text).not.toContain(made.token)
    const keys = expectStatus(await call(stack, "GET", "/v1/keys", acct.owner), 200, "keys")
    expect(keys.keys.filter((k: { name: string }) => k.name === "once")).toHaveLength(1)
  })

  it("a malformed key is refused naming the header, and creates nothing", async () => {
    for (const bad of ["", "has space", "x".repeat(256), "tab\tkey", "é"]) {
      const answer = await post("/v1/files", { bytes: 1, sha256: "a".repeat(64) }, bad)
      expect(answer.status, JSON.stringify(bad)).toBe(400)
      expectRefused(answer, 400, "invalid_request", "idempotency-key")
    }
    const ok = await post("/v1/files", { bytes: 1, sha256: "a".repeat(64) }, "x".repeat(255))
    expect(ok.status).toBe(201)
  })
})

describe("an answer lost to a timeout", () => {
  let slow: Stack
  let owner: TestAccount
  let slowFn: string

  beforeAll(async () => {
    // Every command ask gives up after 1 ms: the command is stored, but its answer comes too late.
    slow = await startStack({ settings: { COMMAND_ASK_TIMEOUT_MS: 1 } })
    owner = await createAccount(slow)
    slowFn = (await publish(slow, owner)).function
  }, 120_000)

  afterAll(() => closeStack(slow), 120_000)

  it("is found by the retry with the same key: one command, never a 500 for one that was stored", async () => {
    const run = (await startRun(slow, owner, slowFn)).id
    const key = uniqueKey()
    const cmd = { kind: "write", arguments: { file_path: "once.txt", content: "1\n" } }
    const answers: Array<Answer> = []
    for (let i = 0; i < 50; i++) {
      const a = await call(
        slow,
        "POST",
        `/v1/runs/${run}/commands`,
        { ...owner.admin, "idempotency-key": key },
        cmd,
      )
      answers.push(a)
      if (a.status === 201) break
      // The spec's retry rule: `internal` (500, or 503 for an actor that did not answer in time)
      // and `conflict` are retried unchanged.
      expect(["internal", "conflict"], a.text).toContain(a.body?.code)
      expect([500, 503, 409], a.text).toContain(a.status)
      await new Promise((r) => setTimeout(r, 100))
    }
    const done = answers.at(-1)!
    expect(done.status, done.text).toBe(201)
    const list = expectStatus(await call(slow, "GET", `/v1/runs/${run}/commands`, owner.admin), 200, "list")
    expect(list.commands.filter((c: { kind: string }) => c.kind === "write")).toHaveLength(1)
    expect(list.commands.find((c: { kind: string }) => c.kind === "write").id).toBe(done.body.id)
  })
})

describe("a claim on a key", () => {
  let held: Stack
  let owner: TestAccount
  let heldFn: string

  beforeAll(async () => {
    // Asks wait long enough for a request to outlive a stale claim.
    held = await startStack({ settings: { COMMAND_ASK_TIMEOUT_MS: STALE_CLAIM_MS + 6_000 } })
    owner = await createAccount(held)
    heldFn = (await publish(held, owner)).function
  }, 120_000)

  afterAll(() => closeStack(held), 120_000)

  it("is renewed while its request runs, so a retry past the stale age is still told to wait", async () => {
    const run = (await startRun(held, owner, heldFn)).id
    expectStatus(
      await call(held, "POST", `/v1/runs/${run}/commands`, owner.admin, {
        kind: "bash",
        arguments: { command: "true" },
      }),
      201,
      "a first command",
    )
    // No actor worker: the command's ask waits, and its request holds the claim.
    await held.stopActors()
    const key = uniqueKey()
    const cmd = { kind: "write", arguments: { file_path: "held.txt", content: "1\n" } }
    const headers = { ...owner.admin, "idempotency-key": key }
    const first = call(held, "POST", `/v1/runs/${run}/commands`, headers, cmd)
    await new Promise((r) => setTimeout(r, STALE_CLAIM_MS + 2_000))
    const retry = await call(held, "POST", `/v1/runs/${run}/commands`, headers, cmd)
    expectRefused(retry, 409, "conflict", "idempotency-key")
    expect(retry.headers["retry-after"]).toBe("1")
    await held.startActors()
    const answered = await first
    // The first request answers the command (or, its ask having timed out, is retried to it).
    const made =
      answered.status === 201
        ? answered.body
        : expectStatus(await call(held, "POST", `/v1/runs/${run}/commands`, headers, cmd), 201, "retry")
    const list = expectStatus(await call(held, "GET", `/v1/runs/${run}/commands`, owner.admin), 200, "list")
    expect(
      list.commands.filter((c: { kind: string }) => c.kind === "write").map((c: { id: string }) => c.id),
    ).toEqual([made.id])
  }, 120_000)
})
