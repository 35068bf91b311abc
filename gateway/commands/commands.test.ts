/**
 * The commands API without a machine: every validation boundary (body, arguments per kind, the
 * 128 KiB arguments limit, `wait` on every waiting route and on the create, `since`, `after`), who
 * may reach a run's commands (404 for other accounts, 403 `key_scope` for run keys of other
 * functions), and the long polls — answered when the awaited change happens, at the end of `wait`
 * otherwise, and ended by a client that goes away.
 *
 * Through HTTP against the whole stack with no host agent: runs stay `queued`, so their commands
 * stay `queued` until cancelled (the run actor cancels them itself, having no machine to ask).
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Nats } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import {
  advertiseBase,
  call,
  createAccount,
  expectRefused,
  expectStatus,
  type Headers,
  type Json,
  publish,
  runKey,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "../../test/harness/Stack.ts"

// A list read holds about this much JSON (small, so paging shows with a few large commands).
const LIST_MAX_BYTES = 64 * 1024

let stack: Stack
let a: TestAccount
let b: TestAccount
let fn: Json // a function of a
let otherFn: Json // another function of a
let runKeyThis: Headers // a run key of a for `fn`
let runKeyOther: Headers // a run key of a for `otherFn` only
let run: string // a queued run of `fn`
let otherRun: string // a queued run of `otherFn`

beforeAll(async () => {
  stack = await startStack({ noHost: true, settings: { COMMAND_LIST_MAX_BYTES: LIST_MAX_BYTES } })
  await advertiseBase(stack, "host_commands_test")
  a = await createAccount(stack, { name: "alpha", memoryMib: 65_536 })
  b = await createAccount(stack, { name: "beta" })
  fn = await publish(stack, a, { name: "commands" })
  otherFn = await publish(stack, a, { name: "other" })
  runKeyThis = await runKey(stack, a, [fn.function])
  runKeyOther = await runKey(stack, a, [otherFn.function])
  run = (await startRun(stack, a, fn.function)).id
  otherRun = (await startRun(stack, a, otherFn.function)).id
}, 120_000)

afterAll(async () => {
  const left = await stack?.close()
  expect(left ?? []).toEqual([])
})

const post = (body: unknown, r: string = run, headers: Headers = a.admin, query = "") =>
  call(stack, "POST", `/v1/runs/${r}/commands${query}`, headers, body)
/** A create of `bash true` on `run` with query `query` (`?wait=…`). */
const postTrue = (query: string, headers: Headers = a.admin) =>
  post({ kind: "bash", arguments: { command: "true" } }, run, headers, query)
const send = async (kind: string, args: Record<string, unknown>, r: string = run): Promise<Json> =>
  expectStatus(await post({ kind, arguments: args }, r), 201, `POST commands ${kind}`)
const get = (path: string, headers: Headers = a.admin) => call(stack, "GET", path, headers)
const cancel = (r: string, cid: string, headers: Headers = a.admin) =>
  call(stack, "POST", `/v1/runs/${r}/commands/${cid}/cancel`, headers)

/**
 * Waits for the gateway's access line of request `requestId` marked as a client that left (it is
 * written when the handler's fiber ends).
 */
const accessLineAborted = (requestId: string) =>
  expect
    .poll(
      () =>
        stack.lines.some(
          (l) => l.role === "gateway" && l.line.includes(requestId) && l.line.includes('"aborted":true'),
        ),
      { timeout: 15_000, interval: 100 },
    )
    .toBe(true)

/** The run's change counter now: its list read to the end (a read holds about `LIST_MAX_BYTES`). */
const latest = async (r: string = run): Promise<number> => {
  let since = 0
  for (;;) {
    const list = expectStatus(await get(`/v1/runs/${r}/commands?since=${since}`), 200, "list")
    if (list.commands.length === 0) return since
    since = list.sequence
  }
}
/** The run's commands changed after `since`. */
const changedSince = async (since: number, r: string = run): Promise<Array<Json>> =>
  expectStatus(await get(`/v1/runs/${r}/commands?since=${since}`), 200, "list").commands

/**
 * Counts the reads of run `r`'s command records from now on (not of its index entries, which a
 * gateway reads to find a command it did not create): a spy on the direct-get subjects of the
 * records' keys sees each read request (the stack's server is a single node).
 */
const countReads = (r: string) =>
  stack.run(
    Effect.gen(function* () {
      const { connection } = yield* Nats
      const { names } = yield* Storage
      const bucket = names.kv.commands.name
      let reads = 0
      const spy = connection.subscribe(`$JS.API.DIRECT.GET.KV_${bucket}.$KV.${bucket}.${r}.*`, {
        callback: () => {
          reads++
        },
      })
      yield* Effect.promise(() => connection.flush())
      return {
        reads: async () => {
          await connection.flush()
          return reads
        },
        stop: () => spy.unsubscribe(),
      }
    }),
  )

// `write` arguments whose JSON is exactly `bytes` long.
const writeOf = (bytes: number) => {
  const base = JSON.stringify({ file_path: "a.txt", content: "" }).length
  return { file_path: "a.txt", content: "x".repeat(bytes - base) }
}

describe("POST /v1/runs/{id}/commands: the body", () => {
  const refusals: ReadonlyArray<readonly [string, unknown, string]> = [
    ["no kind", { arguments: {} }, "kind"],
    ["an unknown kind", { kind: "dance", arguments: {} }, "kind"],
    ["no arguments", { kind: "bash" }, "arguments"],
    ["arguments not an object", { kind: "bash", arguments: ["ls"] }, "arguments"],
    ["an unknown field", { kind: "bash", arguments: { command: "ls" }, extra: 1 }, "extra"],
    ["bash without command", { kind: "bash", arguments: {} }, "arguments.command"],
    ["bash with an empty command", { kind: "bash", arguments: { command: "" } }, "arguments.command"],
    [
      "bash timeout_ms 0",
      { kind: "bash", arguments: { command: "ls", timeout_ms: 0 } },
      "arguments.timeout_ms",
    ],
    [
      "bash timeout_ms over 24 hours",
      { kind: "bash", arguments: { command: "ls", timeout_ms: 86_400_001 } },
      "arguments.timeout_ms",
    ],
    [
      "bash env with a bad name",
      { kind: "bash", arguments: { command: "ls", env: { "1X": "y" } } },
      "arguments.env.1X",
    ],
    [
      "bash with an unknown argument",
      { kind: "bash", arguments: { command: "ls", cwd: "/" } },
      "arguments.cwd",
    ],
    ["read offset 0", { kind: "read", arguments: { file_path: "a", offset: 0 } }, "arguments.offset"],
    [
      "read limit not a number",
      { kind: "read", arguments: { file_path: "a", limit: "9" } },
      "arguments.limit",
    ],
    ["write without content", { kind: "write", arguments: { file_path: "a" } }, "arguments.content"],
    ["edit without edits", { kind: "edit", arguments: { file_path: "a", edits: [] } }, "arguments.edits"],
    [
      "edit with an empty old_text",
      { kind: "edit", arguments: { file_path: "a", edits: [{ old_text: "", new_text: "b" }] } },
      "arguments.edits[0].old_text",
    ],
    ["list with an empty path", { kind: "list", arguments: { path: "" } }, "arguments.path"],
    [
      "put of something not an upload",
      { kind: "put", arguments: { file: "x", path: "a" } },
      "arguments.file",
    ],
    ["get without path", { kind: "get", arguments: {} }, "arguments.path"],
    ["finish with another state", { kind: "finish", arguments: { state: "done" } }, "arguments.state"],
    [
      "terminal with a bad public key",
      { kind: "terminal", arguments: { rows: 24, cols: 80, public_key: "abc" } },
      "arguments.public_key",
    ],
    [
      "terminal with 0 rows",
      { kind: "terminal", arguments: { rows: 0, cols: 80, public_key: "abc" } },
      "arguments.rows",
    ],
  ]
  for (const [name, body, field] of refusals) {
    it(`${name} → 400 naming ${field}`, async () => {
      expectRefused(await post(body), 400, "invalid_request", field)
    })
  }

  it("an unknown kind names the kinds", async () => {
    const answer = await post({ kind: "dance", arguments: {} })
    expect(answer.body.error).toBe(
      "kind: must be one of bash, read, write, edit, list, put, get, finish, terminal",
    )
  })

  it("arguments of exactly 128 KiB of JSON are taken; one byte more is refused naming arguments", async () => {
    const at = writeOf(131_072)
    expect(Buffer.byteLength(JSON.stringify(at))).toBe(131_072)
    const taken = await send("write", at)
    expect(taken).toMatchObject({ kind: "write", state: "queued", arguments: at })
    const over = writeOf(131_073)
    expectRefused(await post({ kind: "write", arguments: over }), 400, "invalid_request", "arguments")
    expect((await post({ kind: "write", arguments: over })).body.error).toBe(
      "arguments: at most 131072 bytes of JSON",
    )
  })

  it("the limit counts UTF-8 bytes, not characters", async () => {
    // 43,690 × "€" is 131,070 bytes of content but 43,690 characters.
    const base = JSON.stringify({ file_path: "a.txt", content: "" }).length
    const content = "€".repeat(Math.floor((131_073 - base) / 3) + 1)
    expectRefused(
      await post({ kind: "write", arguments: { file_path: "a.txt", content } }),
      400,
      "invalid_request",
      "arguments",
    )
  })
})

describe("the record", () => {
  it("201: cmd_ id, queued, source caller, increasing sequence, arguments with defaults", async () => {
    const first = await send("bash", { command: "echo one" })
    const second = await send("list", { path: "." })
    expect(first).toMatchObject({
      run,
      kind: "bash",
      state: "queued",
      source: "caller",
      arguments: { command: "echo one", timeout_ms: 300_000 },
    })
    expect(first.id).toMatch(/^cmd_[0-9a-z]{26}$/)
    expect(second.sequence).toBe(first.sequence + 1)
    expect(expectStatus(await get(`/v1/runs/${run}/commands/${first.id}`), 200, "GET")).toEqual(first)
  })
})

describe("who may reach a run's commands", () => {
  let cid: string
  beforeAll(async () => {
    cid = (await send("bash", { command: "true" })).id
  })

  const routes = (r: string, c: string) =>
    [
      ["POST", `/v1/runs/${r}/commands`, { kind: "bash", arguments: { command: "true" } }],
      ["GET", `/v1/runs/${r}/commands/${c}`, undefined],
      ["GET", `/v1/runs/${r}/commands`, undefined],
      ["GET", `/v1/runs/${r}/commands/${c}/output`, undefined],
      ["POST", `/v1/runs/${r}/commands/${c}/cancel`, undefined],
    ] as const

  it("another account's key: 404 on every route", async () => {
    for (const [method, path, body] of routes(run, cid))
      expectRefused(await call(stack, method, path, b.admin, body), 404, "not_found")
  })

  it("a run key of another function: 403 key_scope on every route", async () => {
    for (const [method, path, body] of routes(run, cid))
      expectRefused(await call(stack, method, path, runKeyOther, body), 403, "key_scope")
  })

  it("a run key of the run's function and the owner get through", async () => {
    expect((await get(`/v1/runs/${run}/commands/${cid}`, runKeyThis)).status).toBe(200)
    expect((await get(`/v1/runs/${run}/commands`, a.owner)).status).toBe(200)
    expect((await post({ kind: "bash", arguments: { command: "true" } }, run, runKeyThis)).status).toBe(201)
  })

  it("an unknown run, a malformed run id, an unknown command and another run's command: 404", async () => {
    const unknownRun = "run_00000000000000000000000000"
    expectRefused(await post({ kind: "bash", arguments: { command: "true" } }, unknownRun), 404, "not_found")
    expectRefused(await get(`/v1/runs/${unknownRun}/commands`), 404, "not_found")
    expectRefused(await get("/v1/runs/run.x*/commands"), 404, "not_found")
    expectRefused(await get(`/v1/runs/${run}/commands/cmd_00000000000000000000000000`), 404, "not_found")
    expectRefused(await get(`/v1/runs/${run}/commands/cmd.*`), 404, "not_found")
    const other = await send("bash", { command: "true" }, otherRun)
    expectRefused(await get(`/v1/runs/${run}/commands/${other.id}`), 404, "not_found")
    expectRefused(await get(`/v1/runs/${run}/commands/${other.id}/output`), 404, "not_found")
    expectRefused(await cancel(run, other.id), 404, "not_found")
  })
})

describe("query parameters", () => {
  let ended: Json // a cancelled command: waits on it answer at once
  beforeAll(async () => {
    const sent = await send("bash", { command: "sleep 1" })
    ended = expectStatus(await cancel(run, sent.id), 200, "cancel")
  })

  const badWaits = ["26", "-1", "1.5", "abc", "", "0x10", "1e1", " 5"]
  for (const w of badWaits) {
    it(`wait=${JSON.stringify(w)} → 400 naming wait on every waiting route`, async () => {
      const q = `wait=${encodeURIComponent(w)}`
      expectRefused(await get(`/v1/runs/${run}/commands/${ended.id}?${q}`), 400, "invalid_request", "wait")
      expectRefused(await get(`/v1/runs/${run}/commands?${q}`), 400, "invalid_request", "wait")
      expectRefused(
        await get(`/v1/runs/${run}/commands/${ended.id}/output?${q}`),
        400,
        "invalid_request",
        "wait",
      )
    })
  }

  it("a create with a bad wait is refused naming wait, and adds no command", async () => {
    const before = await latest()
    for (const w of badWaits)
      expectRefused(await postTrue(`?wait=${encodeURIComponent(w)}`), 400, "invalid_request", "wait")
    expect(await changedSince(before)).toEqual([])
    // The same create with a good wait adds one (so the empty list above is not a list that shows nothing).
    const sent = expectStatus(await postTrue("?wait=0"), 201, "POST wait=0")
    expect((await changedSince(before)).map((c) => c.id)).toEqual([sent.id])
  })

  it("wait=25 and wait=0 are taken", async () => {
    for (const w of ["0", "25"]) {
      expect(expectStatus(await get(`/v1/runs/${run}/commands/${ended.id}?wait=${w}`), 200, "GET")).toEqual(
        ended,
      )
      expect((await get(`/v1/runs/${run}/commands/${ended.id}/output?wait=${w}`)).body.done).toBe(true)
    }
    // A list read with something new answers at once, whatever the wait.
    expect((await get(`/v1/runs/${run}/commands?since=0&wait=25`)).status).toBe(200)
  })

  for (const [name, value] of [
    ["since", "-1"],
    ["since", "x"],
    ["since", "1.5"],
    ["since", "9007199254740993"],
    ["after", "-1"],
    ["after", "y"],
  ] as const) {
    it(`${name}=${value} → 400 naming ${name}`, async () => {
      const path =
        name === "since"
          ? `/v1/runs/${run}/commands?since=${value}`
          : `/v1/runs/${run}/commands/${ended.id}/output?after=${value}`
      expectRefused(await get(path), 400, "invalid_request", name)
    })
  }

  it("other query parameters are ignored", async () => {
    expect((await get(`/v1/runs/${run}/commands/${ended.id}?cachebust=1`)).status).toBe(200)
  })

  it("validation comes after authentication", async () => {
    expectRefused(await call(stack, "GET", `/v1/runs/${run}/commands?wait=99`, {}), 401, "unauthenticated")
    expectRefused(await postTrue("?wait=99", {}), 401, "unauthenticated")
  })

  it("the API document lists each route's query parameters", async () => {
    const doc = expectStatus(await get("/v1/openapi.json"), 200, "openapi")
    const names = (path: string, method: string) =>
      (doc.paths[path][method].parameters as Array<Json>).filter((p) => p.in === "query").map((p) => p.name)
    expect(names("/v1/runs/{id}/commands", "post")).toEqual(["wait"])
    expect(names("/v1/runs/{id}/commands/{cid}", "get")).toEqual(["wait"])
    expect(names("/v1/runs/{id}/commands", "get").sort()).toEqual(["since", "wait"])
    expect(names("/v1/runs/{id}/commands/{cid}/output", "get").sort()).toEqual(["after", "wait"])
    expect(
      doc.paths["/v1/runs/{id}/commands"].post.parameters.find((p: Json) => p.in === "query"),
    ).toMatchObject({
      required: false,
      description: expect.stringContaining("0 to 25"),
    })
  })
})

describe("waiting for one command", () => {
  it("wait answers the queued record when nothing happens in time", async () => {
    const sent = await send("bash", { command: "true" })
    expect(expectStatus(await get(`/v1/runs/${run}/commands/${sent.id}?wait=1`), 200, "GET")).toEqual(sent)
  })

  it("a waiting read answers as soon as the command ends (cancelled by another request)", async () => {
    const sent = await send("bash", { command: "true" })
    const waiting = get(`/v1/runs/${run}/commands/${sent.id}?wait=25`)
    const cancelled = expectStatus(await cancel(run, sent.id), 200, "cancel")
    expect(cancelled).toMatchObject({ id: sent.id, state: "cancelled" })
    expect(cancelled.ended_at).toBeDefined()
    expect(expectStatus(await waiting, 200, "GET wait")).toEqual(cancelled)
  })

  it("a command created through this gateway is waited on with no read: its run's follower has its writes", async () => {
    // A run no request has named yet: its first create makes its follower.
    const fresh = (await startRun(stack, a, fn.function)).id
    const sent = await send("bash", { command: "true" }, fresh)
    const spy = await countReads(fresh)
    try {
      expect(expectStatus(await get(`/v1/runs/${fresh}/commands/${sent.id}?wait=1`), 200, "GET")).toEqual(
        sent,
      )
      expect(await spy.reads()).toBe(0)
      // The end comes to a wait the same way.
      const waiting = get(`/v1/runs/${fresh}/commands/${sent.id}?wait=25`)
      const cancelled = expectStatus(await cancel(fresh, sent.id), 200, "cancel")
      expect(expectStatus(await waiting, 200, "GET wait")).toEqual(cancelled)
    } finally {
      spy.stop()
    }
  })

  it("a gateway that did not see a command's writes reads it once, then waits for its end", async () => {
    const sent = await send("bash", { command: "true" })
    // A new gateway (its own connection) follows no run yet.
    await stack.stopGateway()
    await stack.startGateway()
    const spy = await countReads(run)
    try {
      const waiting = get(`/v1/runs/${run}/commands/${sent.id}?wait=25`)
      await expect.poll(() => spy.reads(), { timeout: 15_000, interval: 50 }).toBe(1)
      const cancelled = expectStatus(await cancel(run, sent.id), 200, "cancel")
      expect(cancelled).toMatchObject({ id: sent.id, state: "cancelled" })
      expect(expectStatus(await waiting, 200, "GET wait")).toEqual(cancelled)
    } finally {
      spy.stop()
    }
  })

  it("a create with wait answers its queued record when nothing happens in time", async () => {
    const sent = expectStatus(await postTrue("?wait=1"), 201, "POST wait=1")
    expect(sent).toMatchObject({ kind: "bash", state: "queued", source: "caller" })
    expect(expectStatus(await get(`/v1/runs/${run}/commands/${sent.id}`), 200, "GET")).toEqual(sent)
  })

  it("a create with wait answers as soon as the command ends (cancelled by another request)", async () => {
    const since = await latest()
    const waiting = postTrue("?wait=25")
    // The command the waiting create made, from the list's long poll.
    const listed = expectStatus(await get(`/v1/runs/${run}/commands?since=${since}&wait=25`), 200, "list")
    expect(listed.commands).toHaveLength(1)
    const cancelled = expectStatus(await cancel(run, listed.commands[0].id), 200, "cancel")
    expect(cancelled).toMatchObject({ state: "cancelled" })
    expect(expectStatus(await waiting, 201, "POST wait")).toEqual(cancelled)
  })

  it("cancelling an ended command changes nothing", async () => {
    const sent = await send("read", { file_path: "x" })
    const first = expectStatus(await cancel(run, sent.id), 200, "cancel")
    expect(expectStatus(await cancel(run, sent.id), 200, "cancel again")).toEqual(first)
  })

  it("a client that goes away ends its wait", async () => {
    const sent = await send("bash", { command: "true" })
    const requestId = `abort-${sent.id}`
    const abort = new AbortController()
    const pending = fetch(`${stack.url}/v1/runs/${run}/commands/${sent.id}?wait=25`, {
      headers: { ...a.admin, "x-request-id": requestId },
      signal: abort.signal,
    }).catch((e: unknown) => e)
    // Give the gateway the request, then leave.
    await new Promise((r) => setTimeout(r, 300))
    abort.abort()
    await pending
    // The access line is written when the handler's fiber ends: well before the 25 s wait would
    // have, and marked as a client that left.
    await accessLineAborted(requestId)
  })

  it("a client that goes away ends a create's wait; the command it sent stays", async () => {
    const since = await latest()
    const requestId = `abort-create-${Date.now()}`
    const command = `echo left-${requestId}`
    const abort = new AbortController()
    const pending = fetch(`${stack.url}/v1/runs/${run}/commands?wait=25`, {
      method: "POST",
      headers: { ...a.admin, "content-type": "application/json", "x-request-id": requestId },
      body: JSON.stringify({ kind: "bash", arguments: { command } }),
      signal: abort.signal,
    }).catch((e: unknown) => e)
    // The command is stored before the wait begins (the run is queued: it will not end).
    await expect
      .poll(
        async () => {
          const list = expectStatus(await get(`/v1/runs/${run}/commands?since=${since}`), 200, "list")
          return (list.commands as Array<Json>).filter((c) => c.arguments.command === command).length
        },
        { timeout: 15_000, interval: 100 },
      )
      .toBe(1)
    abort.abort()
    await pending
    // Its access line is written when the handler's fiber ends, well before the 25 s, marked as
    // a client that left; the command is there, queued, once.
    await accessLineAborted(requestId)
    const list = expectStatus(await get(`/v1/runs/${run}/commands?since=${since}`), 200, "list")
    const sent = (list.commands as Array<Json>).filter((c) => c.arguments.command === command)
    expect(sent).toHaveLength(1)
    expect(sent[0].state).toBe("queued")
  })
})

describe("the list: commands changed after N", () => {
  let listRun: string
  beforeAll(async () => {
    listRun = (await startRun(stack, a, fn.function)).id
  })
  const list = async (query: string) =>
    expectStatus(await get(`/v1/runs/${listRun}/commands?${query}`), 200, `GET list ${query}`)

  it("returns changes in change order with the run's state and the sequence to send next", async () => {
    const empty = await list("")
    expect(empty).toEqual({ commands: [], state: "queued", sequence: 0 })
    const one = await send("bash", { command: "echo 1" }, listRun)
    const two = await send("write", { file_path: "a", content: "b" }, listRun)
    const all = await list("since=0")
    expect(all.commands).toEqual([one, two])
    expect(all.state).toBe("queued")
    const next = await list(`since=${all.sequence}`)
    expect(next).toEqual({ commands: [], state: "queued", sequence: all.sequence })
    // A change brings a command back, at its latest, after the others.
    const cancelled = expectStatus(await cancel(listRun, one.id), 200, "cancel")
    const changed = await list(`since=${all.sequence}`)
    expect(changed.commands).toEqual([cancelled])
    expect(changed.sequence).toBeGreaterThan(all.sequence)
    expect((await list("since=0")).commands).toEqual([two, cancelled])
    // Since a point between the two: only what changed after it.
    const firstOnly = await list(`since=${all.sequence - 1}`)
    expect(firstOnly.commands).toEqual([two, cancelled])
  })

  it("with wait and nothing new, answers at the next change", async () => {
    const now = await list("since=0")
    const waiting = list(`since=${now.sequence}&wait=25`)
    const sent = await send("bash", { command: "echo later" }, listRun)
    const woke = await waiting
    expect(woke.commands).toEqual([sent])
    expect(woke.sequence).toBeGreaterThan(now.sequence)
  })

  it("with wait and nothing happening, answers empty at the end of the wait", async () => {
    const now = await list("since=0")
    expect(await list(`since=${now.sequence}&wait=1`)).toEqual({
      commands: [],
      state: "queued",
      sequence: now.sequence,
    })
  })

  it("one read holds about the size limit (at least one command); the rest come from its sequence", async () => {
    const pageRun = (await startRun(stack, a, fn.function)).id
    const big = Array.from({ length: 3 }, () => writeOf(40 * 1024))
    const sent: Array<Json> = []
    for (const args of big) sent.push(await send("write", args, pageRun))
    const small = await send("list", { path: "." }, pageRun)
    const seen: Array<Json> = []
    let since = 0
    let reads = 0
    for (;;) {
      const page = expectStatus(await get(`/v1/runs/${pageRun}/commands?since=${since}`), 200, "page")
      if (page.commands.length === 0) break
      expect(Buffer.byteLength(JSON.stringify(page.commands))).toBeLessThanOrEqual(LIST_MAX_BYTES + 1024)
      seen.push(...page.commands)
      since = page.sequence
      reads += 1
    }
    expect(seen).toEqual([...sent, small])
    // 40 KiB each in 64 KiB reads: one big command per read, the small one with the last.
    expect(reads).toBe(3)
  })
})

describe("output", () => {
  it("a queued bash command has no output yet; wait answers empty, not done", async () => {
    const sent = await send("bash", { command: "echo hi" })
    expect(
      expectStatus(await get(`/v1/runs/${run}/commands/${sent.id}/output?wait=1`), 200, "output"),
    ).toEqual({
      output: "",
      next: 0,
      output_bytes: 0,
      stored_bytes: 0,
      done: false,
    })
  })

  it("a waiting read of a command that never ran answers done once it is cancelled", async () => {
    const sent = await send("bash", { command: "echo hi" })
    const waiting = get(`/v1/runs/${run}/commands/${sent.id}/output?after=0&wait=25`)
    expectStatus(await cancel(run, sent.id), 200, "cancel")
    expect(expectStatus(await waiting, 200, "output")).toEqual({
      output: "",
      next: 0,
      output_bytes: 0,
      stored_bytes: 0,
      done: true,
    })
  })

  it("a command other than bash has no output: empty, done once ended", async () => {
    const sent = await send("write", { file_path: "a", content: "b" })
    const path = `/v1/runs/${run}/commands/${sent.id}/output`
    expect((await get(path)).body).toEqual({
      output: "",
      next: 0,
      output_bytes: 0,
      stored_bytes: 0,
      done: false,
    })
    const waiting = get(`${path}?after=5&wait=25`)
    expectStatus(await cancel(run, sent.id), 200, "cancel")
    expect((await waiting).body).toEqual({
      output: "",
      next: 5,
      output_bytes: 0,
      stored_bytes: 0,
      done: true,
    })
  })
})
