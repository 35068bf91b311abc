/**
 * Starting runs, refused: every field of `POST /v1/functions/{id}/runs` at its boundary, the
 * function and version, input, size, credit, memory, key scope and suspension, and the listing's
 * query rules. Through HTTP against the whole stack (no host: nothing here needs a machine), and
 * after every refusal nothing changed: no run listed, no memory held at the account actor.
 */
import { Effect, Option } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Accounts from "../../core/Accounts.ts"
import * as AccountClient from "../../core/actors/AccountClient.ts"
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
  setAccountState,
  startRunAnswer,
  startStack,
  type TestAccount,
  upload,
} from "../../test/harness/Stack.ts"

let stack: Stack
let a: TestAccount
let b: TestAccount
let plain: Json // a function without input manifest
let needsInput: Json // a function whose input manifest names an entry
let otherFn: Json // a function of account b
let runKeyOther: Headers // a run key of a that may start only `needsInput`
let inputB: string // a complete upload of b

const setSizes = (account: string, sizes: ReadonlyArray<string>, memoryMib?: number) =>
  stack.run(
    Effect.gen(function* () {
      const { views } = yield* Accounts.Accounts
      const entry = yield* views.accounts.get(account)
      if (Option.isNone(entry)) return yield* Effect.dieMessage(`no account ${account}`)
      const record = entry.value.value
      yield* views.accounts.put(account, {
        ...record,
        limits: {
          sizes: sizes as typeof record.limits.sizes,
          memory_mib: memoryMib ?? record.limits.memory_mib,
        },
      })
    }),
  )

/** Nothing a refused start could leave: no run listed, no memory held, the balance unchanged. */
const expectNothingChanged = async (account: TestAccount, balance?: number) => {
  const listed = expectStatus(await call(stack, "GET", "/v1/runs", account.admin), 200, "GET /v1/runs")
  expect(listed).toEqual({ runs: [] })
  const state = await stack.run(AccountClient.state(account.id))
  expect(state.memory_held_mib).toBe(0)
  expect(state.holds).toEqual({})
  if (balance !== undefined) expect(state.balance_usd_nanos).toBe(balance)
}

beforeAll(async () => {
  stack = await startStack({ noHost: true, settings: { RUN_ASK_TIMEOUT_MS: 3000 } })
  await advertiseBase(stack, "host_runs_test")
  a = await createAccount(stack, { name: "alpha" })
  b = await createAccount(stack, { name: "beta" })
  plain = await publish(stack, a, { name: "plain" })
  needsInput = await publish(stack, a, { name: "needs-input", input_manifest: [{ path: "data.csv" }] })
  otherFn = await publish(stack, b, { name: "other" })
  runKeyOther = await runKey(stack, a, [needsInput.function])
  inputB = await upload(stack, b, Buffer.from("x\n"))
}, 120_000)

afterAll(async () => {
  const left = await stack?.close()
  expect(left ?? []).toEqual([])
})

const start = (body: Record<string, unknown>, fn: string = plain.function, headers: Headers = a.admin) =>
  call(stack, "POST", `/v1/functions/${fn}/runs`, headers, body)

describe("POST /v1/functions/{id}/runs: the body", () => {
  it("prompt is required and a string", async () => {
    expectRefused(await start({}), 400, "invalid_request", "prompt")
    expectRefused(await start({ prompt: 5 }), 400, "invalid_request", "prompt")
  })

  it("prompt: 131,073 characters is refused", async () => {
    expectRefused(await start({ prompt: "x".repeat(131_073) }), 400, "invalid_request", "prompt")
  })

  it("external_reference: 257 bytes is refused (counted in UTF-8 bytes, not characters)", async () => {
    expectRefused(
      await start({ prompt: "go", external_reference: "a".repeat(257) }),
      400,
      "invalid_request",
      "external_reference",
    )
    // 129 characters, 257 bytes.
    expectRefused(
      await start({ prompt: "go", external_reference: `${"é".repeat(128)}a` }),
      400,
      "invalid_request",
      "external_reference",
    )
  })

  it("webhook must be an absolute https:// URL", async () => {
    for (const webhook of ["http://example.com/hook", "example.com/hook", "ftp://example.com/x", "", 7]) {
      expectRefused(await start({ prompt: "go", webhook }), 400, "invalid_request", "webhook")
    }
  })

  it("version must be a whole number from 0", async () => {
    for (const version of [-1, 1.5, "1", null]) {
      expectRefused(await start({ prompt: "go", version }), 400, "invalid_request", "version")
    }
  })

  it("an unknown field is refused, naming it", async () => {
    expectRefused(await start({ prompt: "go", promt: "typo" }), 400, "invalid_request", "promt")
  })

  it("a body that is not an object is refused", async () => {
    expectRefused(await start([] as unknown as Record<string, unknown>), 400, "invalid_request")
  })

  it("changed nothing", () => expectNothingChanged(a))
})

describe("POST /v1/functions/{id}/runs: function, version, input, size", () => {
  it("an unknown function, or another account's, is 404", async () => {
    expectRefused(await start({ prompt: "go" }, "fnc_00000000000000000000000000"), 404, "not_found")
    expectRefused(await start({ prompt: "go" }, otherFn.function), 404, "not_found")
  })

  it("a version that does not exist is 400 naming version", async () => {
    const answer = await start({ prompt: "go", version: 2 })
    expectRefused(answer, 400, "invalid_request", "version")
    expect(answer.body.error).toContain("latest: 1")
  })

  it("input is required when the input manifest names entries", async () => {
    expectRefused(await start({ prompt: "go" }, needsInput.function), 400, "invalid_request", "input")
  })

  it("input must be an upload id", async () => {
    expectRefused(
      await start({ prompt: "go", input: "data.csv" }, needsInput.function),
      400,
      "invalid_request",
      "input",
    )
  })

  it("input: an unknown upload, another account's, or one still pending is refused", async () => {
    const unknown = await start(
      { prompt: "go", input: "file_00000000000000000000000000" },
      needsInput.function,
    )
    expectRefused(unknown, 400, "invalid_request", "input")
    const foreign = await start({ prompt: "go", input: inputB }, needsInput.function)
    expectRefused(foreign, 400, "invalid_request", "input")
    // Another account's upload reads exactly as an unknown one.
    expect(foreign.body.error).toBe(unknown.body.error.replace("file_00000000000000000000000000", inputB))
    const pending = expectStatus(
      await call(stack, "POST", "/v1/files", a.admin, { bytes: 3, sha256: "a".repeat(64) }),
      201,
      "POST /v1/files",
    )
    const answer = await start({ prompt: "go", input: pending.id }, needsInput.function)
    expectRefused(answer, 400, "invalid_request", "input")
    expect(answer.body.error).toContain("not been completed")
  })

  it("input given to a function without input manifest is still checked", async () => {
    expectRefused(await start({ prompt: "go", input: inputB }), 400, "invalid_request", "input")
  })

  it("a size the account may no longer use is 400 naming size", async () => {
    const c = await createAccount(stack, { name: "gamma" })
    const big = await publish(stack, c, { name: "big", size: "xl" })
    await setSizes(c.id, ["s", "m"])
    const answer = await call(stack, "POST", `/v1/functions/${big.function}/runs`, c.admin, { prompt: "go" })
    expectRefused(answer, 400, "invalid_request", "size")
    expect(answer.body.error).toContain("xl")
    await expectNothingChanged(c)
  })

  it("changed nothing", () => expectNothingChanged(a))
})

describe("POST /v1/functions/{id}/runs: who may start", () => {
  it("a run key not naming the function is 403 key_scope, before anything else", async () => {
    expectRefused(await start({ prompt: "go" }, plain.function, runKeyOther), 403, "key_scope")
    expectRefused(await start({}, plain.function, runKeyOther), 403, "key_scope")
  })

  it("a run key naming the function gets as far as the body", async () => {
    expectRefused(await start({}, needsInput.function, runKeyOther), 400, "invalid_request", "prompt")
  })

  it("no credential is 401, before the body is judged", async () => {
    expectRefused(await start({}, plain.function, {}), 401, "unauthenticated")
  })

  it("a suspended account is 403 suspended", async () => {
    const c = await createAccount(stack, { name: "frozen" })
    const fn = await publish(stack, c, { name: "f" })
    await setAccountState(stack, c.id, "suspended")
    const answer = await call(stack, "POST", `/v1/functions/${fn.function}/runs`, c.admin, { prompt: "go" })
    expectRefused(answer, 403, "suspended")
    // Its runs can still be read.
    expect((await call(stack, "GET", "/v1/runs", c.admin)).status).toBe(200)
    await expectNothingChanged(c)
  })

  it("an account at its minimum balance is 402 no_credit", async () => {
    const c = await createAccount(stack, { name: "broke", creditUsd: 0 })
    const fn = await publish(stack, c, { name: "f" })
    expectRefused(await startRunAnswer(stack, c, fn.function), 402, "no_credit")
    await expectNothingChanged(c, 0)
  })

  it("a run whose memory alone passes the account's limit is 429 memory_limit", async () => {
    const c = await createAccount(stack, { name: "small" })
    const fn = await publish(stack, c, { name: "f" })
    // Size s needs 2048 MiB.
    await setSizes(c.id, ["s", "m", "l", "xl"], 2047)
    const answer = await startRunAnswer(stack, c, fn.function)
    expectRefused(answer, 429, "memory_limit")
    expect(answer.body.error).toContain("2047")
    await expectNothingChanged(c, 100_000_000_000)
  })
})

describe("GET /v1/runs: the query", () => {
  it("a run key must name a function it may use", async () => {
    expectRefused(await call(stack, "GET", "/v1/runs", runKeyOther), 400, "invalid_request", "function")
    expectRefused(
      await call(stack, "GET", `/v1/runs?function=${plain.function}`, runKeyOther),
      403,
      "key_scope",
    )
    const ok = await call(stack, "GET", `/v1/runs?function=${needsInput.function}`, runKeyOther)
    expect({ status: ok.status, body: ok.body }).toEqual({ status: 200, body: { runs: [] } })
  })

  it("state, before and function are checked; unknown parameters refused", async () => {
    expectRefused(await call(stack, "GET", "/v1/runs?state=queued", a.admin), 400, "invalid_request", "state")
    expectRefused(await call(stack, "GET", "/v1/runs?before=x", a.admin), 400, "invalid_request", "before")
    expectRefused(
      await call(stack, "GET", "/v1/runs?function=plain", a.admin),
      400,
      "invalid_request",
      "function",
    )
    expectRefused(await call(stack, "GET", "/v1/runs?page=2", a.admin), 400, "invalid_request", "page")
  })

  it("an unknown run, its log, and a malformed id are 404", async () => {
    for (const path of [
      "/v1/runs/run_00000000000000000000000000",
      "/v1/runs/run_00000000000000000000000000/log",
      "/v1/runs/nope",
    ]) {
      expectRefused(await call(stack, "GET", path, a.admin), 404, "not_found")
    }
  })
})

describe("when the actors do not answer", () => {
  it("503 internal with Retry-After, and once they are back the memory hold is released and no run exists", async () => {
    const c = await createAccount(stack, { name: "outage" })
    const fn = await publish(stack, c, { name: "f" })
    await stack.stopActors()
    try {
      // The spec's retryable code, with the status and wait of a service that is busy, not broken.
      const answer = await startRunAnswer(stack, c, fn.function)
      expectRefused(answer, 503, "internal")
      expect(answer.headers["retry-after"]).toBe("2")
    } finally {
      await stack.startActors()
    }
    // An ask sent now is handled after the start's MayStart and Release (one mailbox, in order).
    await stack.run(AccountClient.askBalance(c.id, "20 seconds"))
    await expectNothingChanged(c, 100_000_000_000)
  })
})
