/**
 * Functions, versions and secrets through real HTTP against a gateway over a real nats-server and
 * the vendor fakes: the API applies the Definition rules and names the field; the defaults it fills
 * are stored; versions never change and concurrent publishes get distinct consecutive numbers;
 * provider references in every form and each refusal; secrets sealed, reused by id, bound to the
 * tool's URL, and never in a response, a log line or a KV value in clear.
 */
import { Effect, Option, Redacted } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Functions } from "../core/Functions.ts"
import * as Kv from "../core/Kv.ts"
import { Secrets } from "../core/Secrets.ts"
import { Storage } from "../core/Storage.ts"
import { personToken } from "../gateway/auth/testing.ts"
import { routes } from "../gateway/functions/group.ts"
import {
  call,
  type Fixture,
  type Json,
  rawKvText,
  startFixture,
  vendorKey,
} from "../gateway/functions/testing.ts"
import { Version } from "../schema/Function.ts"

const OLD_BASE = "debian-bookworm-20250101-0123456789ab"
const NEW_BASE = "debian-trixie-20260101-abcdef012345"
const ENV_CANARY = "envsecret-CANARY-7f3a9c51"
const TOOL_CANARY = "toolsecret-CANARY-19bd44e0"
const canaries = [ENV_CANARY, TOOL_CANARY, vendorKey, "CANARY"]

let f: Fixture
let provider: Json

const minimal = { system_prompt: "Do the task.", output_manifest: [{ path: "result.txt" }] }
// For publishes after the account has several providers (no default any more).
const pinned = { ...minimal, provider: "none" }
const tool = (over: Record<string, unknown> = {}) => ({
  name: "lookup",
  description: "Looks things up.",
  parameters: { type: "object", properties: { q: { type: "string" } }, additionalProperties: false },
  url: "https://tools.example.com/lookup",
  secret: TOOL_CANARY,
  ...over,
})

const post = (path: string, body: unknown, headers = f.admin) => call(f.gw, "POST", path, headers, body)
const get = (path: string, headers = f.admin) => call(f.gw, "GET", path, headers)
const create = (body: Record<string, unknown>, headers = f.admin) =>
  post("/v1/functions", { name: "fn", ...minimal, ...body }, headers)

const expectRefused = (res: { status: number; body: Json }, field: string) => {
  expect(res.status).toBe(400)
  expect(res.body.code).toBe("invalid_request")
  expect(res.body.error.startsWith(`${field}:`), `${res.body.error} names ${field}`).toBe(true)
}

beforeAll(async () => {
  f = await startFixture(routes)
  await f.putHost("h1", [OLD_BASE])
  await f.putHost("h2", [NEW_BASE, OLD_BASE])
  const res = await post("/v1/providers", {
    name: "alpha",
    model: { provider: "openai", model: "gpt-5", compact_at_tokens: 200_000 },
    key: vendorKey,
  })
  expect(res.status).toBe(201)
  provider = res.body
})

afterAll(async () => {
  await f?.close()
})

describe("publishing fills the defaults and stores them", () => {
  it("a minimal function gets every default, and the stored version is what was returned", async () => {
    const res = await create({ external_reference: "ticket-1" })
    expect(res.status).toBe(201)
    const v = res.body
    expect(v).toMatchObject({
      base: NEW_BASE,
      setup: [],
      provider: `${provider.id}@latest`,
      system_prompt: "Do the task.",
      tools: ["bash", "read", "write", "edit", "screenshot", "web_search"],
      custom_tools: [],
      input_manifest: [],
      output_manifest: [{ path: "result.txt", max_bytes: 50 * 1024 ** 3 }],
      environment: [],
      size: "m",
      timeout_minutes: 30,
      version: 1,
      external_reference: "ticket-1",
      created_by: f.admin.authorization ? expect.stringMatching(/^key_/) : "",
    })
    expect(v.function).toMatch(/^fnc_/)
    const detail = await get(`/v1/functions/${v.function}`)
    expect(detail.status).toBe(200)
    expect(detail.body.versions).toEqual([v])
    expect(detail.body.function).toMatchObject({
      id: v.function,
      name: "fn",
      latest: 1,
      updated_by: v.created_by,
    })
    // What KV holds decodes as a Version equal to the answer.
    const stored = await f.gw.run(Effect.flatMap(Functions, (s) => s.version(v.function, 1)))
    expect(Option.getOrThrow(stored)).toEqual(v)
  })

  it("an input entry's max_bytes defaults to 5 GB; given values are kept", async () => {
    const res = await create({
      input_manifest: [
        { path: "data/", description: "the data" },
        { path: "a.txt", max_bytes: 10 },
      ],
      output_manifest: [{ path: "out/", max_bytes: 0 }],
      tools: [],
      size: "s",
      timeout_minutes: 1,
      setup: ["apt-get update"],
      base: OLD_BASE,
    })
    expect(res.status).toBe(201)
    expect(res.body).toMatchObject({
      input_manifest: [
        { path: "data/", description: "the data", max_bytes: 5_000_000_000 },
        { path: "a.txt", max_bytes: 10 },
      ],
      output_manifest: [{ path: "out/", max_bytes: 0 }],
      tools: [],
      size: "s",
      timeout_minutes: 1,
      setup: ["apt-get update"],
      base: OLD_BASE,
    })
  })

  it("with no base known, a publish without base is refused naming base; a stale host's bases do not count", async () => {
    await f.deleteHost("h1")
    await f.deleteHost("h2")
    await f.putHost("stale", [NEW_BASE], { stale: true })
    try {
      expectRefused(await create({}), "base")
      expectRefused(await create({ base: NEW_BASE }), "base")
    } finally {
      await f.deleteHost("stale")
      await f.putHost("h1", [OLD_BASE])
      await f.putHost("h2", [NEW_BASE, OLD_BASE])
    }
  })

  it("a base not in the listing is refused naming base", async () => {
    expectRefused(await create({ base: "debian-sid-20990101-0123456789ab" }), "base")
    expectRefused(await create({ base: "not a base" }), "base")
  })

  it("two functions may share a name; the list carries each one's latest definition and no last run yet", async () => {
    const a = (await create({ name: "twin" })).body
    const b = (await create({ name: "twin", tools: ["bash"] })).body
    await post(`/v1/functions/${b.function}/versions`, { ...minimal, tools: ["read"] })
    const list = await get("/v1/functions")
    expect(list.status).toBe(200)
    const byId = new Map<string, Json>(list.body.functions.map((x: Json) => [x.id, x]))
    expect(byId.get(a.function)).toMatchObject({ name: "twin", latest: 1, definition: { version: 1 } })
    expect(byId.get(b.function)).toMatchObject({
      name: "twin",
      latest: 2,
      definition: { version: 2, tools: ["read"] },
    })
    for (const item of list.body.functions) expect(item).not.toHaveProperty("last")
  })
})

describe("the API applies every Definition rule and names the field", () => {
  const KiB = 1024
  const cases: ReadonlyArray<readonly [string, Record<string, unknown>, string | undefined]> = [
    // [what, body fields, refused field or undefined when accepted]
    ["name at 40 characters", { name: "a".repeat(40) }, undefined],
    ["name at 41 characters", { name: "a".repeat(41) }, "name"],
    ["name with capitals", { name: "Fn" }, "name"],
    ["system_prompt at 64 KiB", { system_prompt: "x".repeat(64 * KiB) }, undefined],
    ["system_prompt one byte over", { system_prompt: "x".repeat(64 * KiB + 1) }, "system_prompt"],
    ["system_prompt missing", { system_prompt: undefined }, "system_prompt"],
    ["output_manifest missing", { output_manifest: undefined }, "output_manifest"],
    ["output_manifest empty", { output_manifest: [] }, "output_manifest"],
    ["64 setup commands", { setup: Array(64).fill("true") }, undefined],
    ["65 setup commands", { setup: Array(65).fill("true") }, "setup"],
    ["a setup command at 16 KiB", { setup: ["x".repeat(16 * KiB)] }, undefined],
    ["a setup command one byte over", { setup: ["true", "x".repeat(16 * KiB + 1)] }, "setup[1]"],
    ["timeout_minutes 1440", { timeout_minutes: 1440 }, undefined],
    ["timeout_minutes 1441", { timeout_minutes: 1441 }, "timeout_minutes"],
    ["timeout_minutes 0", { timeout_minutes: 0 }, "timeout_minutes"],
    ["timeout_minutes 1.5", { timeout_minutes: 1.5 }, "timeout_minutes"],
    ["size xxl", { size: "xxl" }, "size"],
    ["an unknown tool", { tools: ["bash", "python"] }, "tools[1]"],
    ["a tool twice", { tools: ["bash", "bash"] }, "tools[1]"],
    ["an unknown field", { timeout_minute: 5 }, "timeout_minute"],
    ["external_reference at 256 bytes", { external_reference: "r".repeat(256) }, undefined],
    ["external_reference at 257 bytes", { external_reference: "r".repeat(257) }, "external_reference"],
    ["a provider reference of no form", { provider: "prv_x@@1" }, "provider"],
    [
      "64 input entries",
      { input_manifest: Array.from({ length: 64 }, (_, i) => ({ path: `f${i}` })) },
      undefined,
    ],
    [
      "65 input entries",
      { input_manifest: Array.from({ length: 65 }, (_, i) => ({ path: `f${i}` })) },
      "input_manifest",
    ],
    ["a path with ..", { output_manifest: [{ path: "a/../b" }] }, "output_manifest[0].path"],
    ["an absolute path", { input_manifest: [{ path: "/etc/passwd" }] }, "input_manifest[0].path"],
    ["a path twice", { output_manifest: [{ path: "a" }, { path: "a" }] }, "output_manifest[1]"],
    [
      "a description at 2000 bytes",
      { output_manifest: [{ path: "a", description: "d".repeat(2000) }] },
      undefined,
    ],
    [
      "a description at 2001 bytes",
      { output_manifest: [{ path: "a", description: "d".repeat(2001) }] },
      "output_manifest[0].description",
    ],
    [
      "output max_bytes at 50 GiB",
      { output_manifest: [{ path: "a", max_bytes: 50 * 1024 ** 3 }] },
      undefined,
    ],
    [
      "output max_bytes past 50 GiB",
      { output_manifest: [{ path: "a", max_bytes: 50 * 1024 ** 3 + 1 }] },
      "output_manifest[0].max_bytes",
    ],
    [
      "64 variables",
      { environment: Array.from({ length: 64 }, (_, i) => ({ name: `V${i}`, value: "x" })) },
      undefined,
    ],
    [
      "65 variables",
      { environment: Array.from({ length: 65 }, (_, i) => ({ name: `V${i}`, value: "x" })) },
      "environment",
    ],
    ["a SERVICE_ variable", { environment: [{ name: "SERVICE_TOKEN", value: "x" }] }, "environment[0].name"],
    ["a variable name with a dash", { environment: [{ name: "A-B", value: "x" }] }, "environment[0].name"],
    [
      "a variable twice",
      {
        environment: [
          { name: "A", value: "1" },
          { name: "A", value: "2" },
        ],
      },
      "environment[1]",
    ],
    ["a value at 64 KiB", { environment: [{ name: "A", value: "v".repeat(64 * KiB) }] }, undefined],
    [
      "a value one byte over",
      { environment: [{ name: "A", value: "v".repeat(64 * KiB + 1) }] },
      "environment[0].value",
    ],
    ["a secret at 4 KiB", { environment: [{ name: "A", secret: "s".repeat(4 * KiB) }] }, undefined],
    [
      "a secret one byte over",
      { environment: [{ name: "A", secret: "s".repeat(4 * KiB + 1) }] },
      "environment[0].secret",
    ],
    [
      "a variable with value and secret",
      { environment: [{ name: "A", value: "1", secret: "2" }] },
      "environment[0].secret",
    ],
    ["a variable with nothing", { environment: [{ name: "A" }] }, "environment[0].value"],
    [
      "16 custom tools",
      { custom_tools: Array.from({ length: 16 }, (_, i) => tool({ name: `t${i}` })) },
      undefined,
    ],
    [
      "17 custom tools",
      { custom_tools: Array.from({ length: 17 }, (_, i) => tool({ name: `t${i}` })) },
      "custom_tools",
    ],
    ["a tool named like a built-in", { custom_tools: [tool({ name: "give_up" })] }, "custom_tools[0].name"],
    ["a tool name with capitals", { custom_tools: [tool({ name: "Lookup" })] }, "custom_tools[0].name"],
    ["a tool name twice", { custom_tools: [tool(), tool()] }, "custom_tools[1]"],
    [
      "an http tool URL",
      { custom_tools: [tool({ url: "http://tools.example.com/x" })] },
      "custom_tools[0].url",
    ],
    // Whether the host is public is checked when the tool is called (DNS can change), not here.
    [
      "a tool URL with credentials",
      { custom_tools: [tool({ url: "https://u:p@tools.example.com/x" })] },
      "custom_tools[0].url",
    ],
    [
      "parameters with an open object",
      {
        custom_tools: [
          tool({
            parameters: {
              type: "object",
              properties: { q: { type: "object" } },
              additionalProperties: false,
            },
          }),
        ],
      },
      "custom_tools[0].parameters.properties.q",
    ],
    [
      "parameters not an object schema",
      { custom_tools: [tool({ parameters: { type: "string" } })] },
      "custom_tools[0].parameters.type",
    ],
    ["a tool without secret", { custom_tools: [tool({ secret: undefined })] }, "custom_tools[0].secret"],
    ["a tool timeout of 600 s", { custom_tools: [tool({ timeout_seconds: 600 })] }, undefined],
    [
      "a tool timeout of 601 s",
      { custom_tools: [tool({ timeout_seconds: 601 })] },
      "custom_tools[0].timeout_seconds",
    ],
    [
      "a tool timeout of 0 s",
      { custom_tools: [tool({ timeout_seconds: 0 })] },
      "custom_tools[0].timeout_seconds",
    ],
  ]
  for (const [what, fields, field] of cases) {
    it(`${what} → ${field === undefined ? "201" : `400 naming ${field}`}`, async () => {
      const res = await create(fields)
      if (field === undefined) expect(res.status, res.text.slice(0, 300)).toBe(201)
      else expectRefused(res, field)
    })
  }

  it("the same rules hold for a new version", async () => {
    const fn = (await create({})).body.function
    expectRefused(
      await post(`/v1/functions/${fn}/versions`, { ...minimal, timeout_minutes: 1441 }),
      "timeout_minutes",
    )
    expectRefused(await post(`/v1/functions/${fn}/versions`, { ...minimal, name: "x" }), "name")
    expectRefused(await post(`/v1/functions/${fn}/versions`, { system_prompt: "x" }), "output_manifest")
  })

  it("a size the account may not use is refused naming size", async () => {
    const views = f.gw.accounts.views
    const entry = Option.getOrThrow(await f.gw.run(views.accounts.get(f.account.id)))
    await f.gw.run(
      views.accounts.put(f.account.id, {
        ...entry.value,
        limits: { ...entry.value.limits, sizes: ["s", "m"] },
      }),
    )
    try {
      expect((await create({ size: "m" })).status).toBe(201)
      expectRefused(await create({ size: "l" }), "size")
    } finally {
      await f.gw.run(views.accounts.put(f.account.id, entry.value))
    }
  })
})

describe("versions", () => {
  it("each publish is the next number; earlier versions never change", async () => {
    const v1 = (await create({ system_prompt: "one" })).body
    const v2 = await post(`/v1/functions/${v1.function}/versions`, { ...minimal, system_prompt: "two" })
    expect(v2.status).toBe(201)
    expect(v2.body).toMatchObject({ function: v1.function, version: 2, system_prompt: "two" })
    const detail = (await get(`/v1/functions/${v1.function}`)).body
    expect(detail.versions.map((v: Json) => v.version)).toEqual([1, 2])
    expect(detail.versions[0]).toEqual(v1)
    expect(detail.function.latest).toBe(2)
    // The store itself refuses to write a version number twice.
    const again = await f.gw.run(
      Effect.gen(function* () {
        const { names } = yield* Storage
        const kv = yield* Kv.make(names.kv.versions.name, Version)
        return yield* Effect.either(kv.create(`${v1.function}.1`, { ...v1, system_prompt: "changed" }))
      }),
    )
    expect(again._tag).toBe("Left")
    expect((await get(`/v1/functions/${v1.function}`)).body.versions[0]).toEqual(v1)
  })

  it("concurrent publishes get distinct consecutive versions", async () => {
    const fn = (await create({})).body.function
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        post(`/v1/functions/${fn}/versions`, { ...minimal, system_prompt: `p${i}` }),
      ),
    )
    const ok = results.filter((r) => r.status === 201)
    for (const r of results) expect([201, 409]).toContain(r.status)
    const numbers = ok.map((r) => r.body.version).sort((a: number, b: number) => a - b)
    expect(numbers).toEqual(Array.from({ length: ok.length }, (_, i) => i + 2))
    expect(ok.length).toBeGreaterThan(0)
    const detail = (await get(`/v1/functions/${fn}`)).body
    expect(detail.function.latest).toBe(ok.length + 1)
    expect(detail.versions.map((v: Json) => v.version)).toEqual(
      Array.from({ length: ok.length + 1 }, (_, i) => i + 1),
    )
  })

  it("a version of an unknown or another account's function is 404", async () => {
    expect((await post("/v1/functions/fnc_00000000000000000000000000/versions", minimal)).status).toBe(404)
    expect((await post("/v1/functions/nonsense/versions", minimal)).status).toBe(404)
    expect((await get("/v1/functions/fnc_00000000000000000000000000")).status).toBe(404)
    const other = await f.gw.run(f.gw.accounts.createAccount("other", "other@example.com"))
    const otherHeaders = {
      authorization: `Bearer ${await personToken(f.keyFile, "other@example.com")}`,
      "service-account": other.account.id,
    }
    const mine = (await create({})).body.function
    expect((await get(`/v1/functions/${mine}`, otherHeaders)).status).toBe(404)
    expect((await post(`/v1/functions/${mine}/versions`, minimal, otherHeaders)).status).toBe(404)
  })
})

describe("provider references", () => {
  let beta: Json
  let dupA: Json
  let dupB: Json
  beforeAll(async () => {
    const model = { provider: "anthropic", model: "claude-sonnet-4-5-20250929", compact_at_tokens: 60_000 }
    beta = (await post("/v1/providers", { name: "beta", model, key: vendorKey })).body
    await post(`/v1/providers/${beta.id}/versions`, { model, key: vendorKey })
    dupA = (await post("/v1/providers", { name: "dup", model, key: vendorKey })).body
    dupB = (await post("/v1/providers", { name: "dup", model, key: vendorKey })).body
  })

  for (const [form, expected] of [
    ["prv_<id>@2", (b: Json) => `${b.id}@2`],
    ["prv_<id>@1", (b: Json) => `${b.id}@1`],
    ["prv_<id>@latest", (b: Json) => `${b.id}@latest`],
    ["beta", (b: Json) => `${b.id}@latest`],
    ["beta@latest", (b: Json) => `${b.id}@latest`],
    ["beta@2", (b: Json) => `${b.id}@2`],
    ["none", () => "none"],
  ] as const) {
    it(`${form} is stored as ${expected({ id: "prv_<id>" })}`, async () => {
      const ref = form.replace("prv_<id>", beta.id)
      const res = await create({ provider: ref })
      expect(res.status, res.text).toBe(201)
      expect(res.body.provider).toBe(expected(beta))
    })
  }

  it("refusals name provider: unknown id, missing version, unknown name, shared name, several providers and none", async () => {
    expectRefused(await create({ provider: "prv_00000000000000000000000000@latest" }), "provider")
    expectRefused(await create({ provider: `${beta.id}@3` }), "provider")
    expectRefused(await create({ provider: "gamma" }), "provider")
    expectRefused(await create({ provider: "gamma@1" }), "provider")
    const shared = await create({ provider: "dup" })
    expectRefused(shared, "provider")
    expect(shared.body.error).toContain(dupA.id)
    expect(shared.body.error).toContain(dupB.id)
    // By id, a provider with a shared name is fine.
    expect((await create({ provider: `${dupA.id}@1` })).status).toBe(201)
    // Several providers: no default.
    expectRefused(await create({}), "provider")
    // An account without providers: no default either, but `none` is fine.
    const other = await f.gw.run(f.gw.accounts.createAccount("empty", "empty@example.com"))
    const headers = {
      authorization: `Bearer ${await personToken(f.keyFile, "empty@example.com")}`,
      "service-account": other.account.id,
    }
    expectRefused(await create({}, headers), "provider")
    expect((await create({ provider: "none" }, headers)).body.provider).toBe("none")
    // Another account's provider is unknown here.
    expectRefused(await create({ provider: `${beta.id}@latest` }, headers), "provider")
  })
})

describe("secrets", () => {
  let first: Json
  beforeAll(async () => {
    const res = await create({
      provider: `${provider.id}@1`,
      environment: [
        { name: "PLAIN", value: "visible" },
        { name: "TOKEN", secret: ENV_CANARY },
      ],
      custom_tools: [tool()],
    })
    expect(res.status).toBe(201)
    first = res.body
  })

  it("a version keeps secret_id in place of each secret, and the sealed value opens to the secret", async () => {
    expect(first.environment).toEqual([
      { name: "PLAIN", value: "visible" },
      { name: "TOKEN", secret_id: expect.stringMatching(/^sec_/) },
    ])
    expect(first.custom_tools[0]).toEqual({
      name: "lookup",
      description: "Looks things up.",
      parameters: tool().parameters,
      url: "https://tools.example.com/lookup",
      secret_id: expect.stringMatching(/^sec_/),
      timeout_seconds: 30,
    })
    const opened = await f.gw.run(
      Effect.flatMap(Secrets, (s) =>
        Effect.all([
          s.open(f.account.id, first.environment[1].secret_id),
          s.open(f.account.id, first.custom_tools[0].secret_id),
        ]),
      ),
    )
    expect(opened.map((o) => Redacted.value(Option.getOrThrow(o)))).toEqual([ENV_CANARY, TOOL_CANARY])
    // Another account cannot open it.
    const other = await f.gw.run(
      Effect.flatMap(Secrets, (s) =>
        s.open("acc_00000000000000000000000000", first.environment[1].secret_id),
      ),
    )
    expect(Option.isNone(other)).toBe(true)
  })

  it("a later version reuses both secrets by id", async () => {
    const res = await post(`/v1/functions/${first.function}/versions`, {
      ...pinned,
      environment: [{ name: "TOKEN2", secret_id: first.environment[1].secret_id }],
      custom_tools: [
        tool({ secret: undefined, secret_id: first.custom_tools[0].secret_id, name: "lookup2" }),
      ],
    })
    expect(res.status, res.text).toBe(201)
    expect(res.body.environment).toEqual([{ name: "TOKEN2", secret_id: first.environment[1].secret_id }])
    expect(res.body.custom_tools[0].secret_id).toBe(first.custom_tools[0].secret_id)
  })

  it("a tool's secret only for a tool at the same URL; kinds and accounts do not mix; unknown ids are refused", async () => {
    const toolSecret = first.custom_tools[0].secret_id
    const envSecret = first.environment[1].secret_id
    const at = (body: Record<string, unknown>) =>
      post(`/v1/functions/${first.function}/versions`, { ...pinned, ...body })
    expectRefused(
      await at({
        custom_tools: [
          tool({ secret: undefined, secret_id: toolSecret, url: "https://evil.example.com/lookup" }),
        ],
      }),
      "custom_tools[0].secret_id",
    )
    expectRefused(
      await at({ custom_tools: [tool({ secret: undefined, secret_id: envSecret })] }),
      "custom_tools[0].secret_id",
    )
    expectRefused(
      await at({ environment: [{ name: "X", secret_id: toolSecret }] }),
      "environment[0].secret_id",
    )
    expectRefused(
      await at({ environment: [{ name: "X", secret_id: "sec_00000000000000000000000000" }] }),
      "environment[0].secret_id",
    )
    expectRefused(
      await at({ environment: [{ name: "X", secret_id: "sec_bad" }] }),
      "environment[0].secret_id",
    )
    // A vendor key's secret is not an environment secret.
    const vendorSecret = await f.gw.run(
      Effect.gen(function* () {
        const { names } = yield* Storage
        const kv = yield* Kv.make(
          names.kv.providers.name,
          (yield* Effect.promise(() => import("../core/Providers.ts"))).ProviderVersion,
        )
        return Option.getOrThrow(yield* kv.get(`${f.account.id}.${provider.id}.1`)).value.key_secret
      }),
    )
    expectRefused(
      await at({ environment: [{ name: "X", secret_id: vendorSecret }] }),
      "environment[0].secret_id",
    )
    // Another account cannot use this account's secret.
    const other = await f.gw.run(f.gw.accounts.createAccount("thief", "thief@example.com"))
    const headers = {
      authorization: `Bearer ${await personToken(f.keyFile, "thief@example.com")}`,
      "service-account": other.account.id,
    }
    expectRefused(
      await create({ provider: "none", environment: [{ name: "X", secret_id: envSecret }] }, headers),
      "environment[0].secret_id",
    )
    // A refused publish stores no secret: the refusal came before sealing.
    const before = await countSecrets()
    expectRefused(
      await at({
        environment: [
          { name: "NEW", secret: ENV_CANARY },
          { name: "X", secret_id: toolSecret },
        ],
      }),
      "environment[1].secret_id",
    )
    expect(await countSecrets()).toBe(before)
  })

  it("no secret appears in any response, log line or KV value in clear", async () => {
    const texts: Array<string> = []
    texts.push((await get("/v1/functions")).text)
    texts.push((await get(`/v1/functions/${first.function}`)).text)
    texts.push((await get("/v1/providers")).text)
    // Error answers for bad secrets do not quote them either.
    texts.push(
      (
        await create({
          provider: "none",
          environment: [{ name: "A", secret: `${"s".repeat(4097)}${ENV_CANARY}` }],
        })
      ).text,
    )
    texts.push((await create({ custom_tools: [tool({ secret: TOOL_CANARY, url: "http://x" })] })).text)
    texts.push((await create({ environment: [{ name: "SERVICE_X", secret: ENV_CANARY }] })).text)
    const kv = await rawKvText(f.gw)
    expect(kv).toContain("sec_")
    const all = [...texts, kv, ...f.gw.lines].join("\n")
    expect(f.gw.lines.length).toBeGreaterThan(10)
    for (const c of canaries) expect(all).not.toContain(c)
  })
})

describe("run keys read only their functions", () => {
  it("lists and reads only the functions named; publishing needs an admin key", async () => {
    const a = (await create({ name: "key-a", provider: "none" })).body.function
    const b = (await create({ name: "key-b", provider: "none" })).body.function
    const runKey = await f.newKey("run", [a])
    const ids = (await get("/v1/functions", runKey)).body.functions.map((x: Json) => x.id)
    expect(ids).toContain(a)
    expect(ids).not.toContain(b)
    expect((await get(`/v1/functions/${a}`, runKey)).status).toBe(200)
    const refused = await get(`/v1/functions/${b}`, runKey)
    expect([refused.status, refused.body.code]).toEqual([403, "key_scope"])
    const all = (await get("/v1/functions", f.runAll)).body.functions.map((x: Json) => x.id)
    expect(all).toEqual(expect.arrayContaining([a, b]))
    const publish = await post(`/v1/functions/${a}/versions`, pinned, runKey)
    expect([publish.status, publish.body.code]).toEqual([403, "key_scope"])
    expect((await post(`/v1/functions/${a}/versions`, pinned, f.owner)).body.created_by).toBe(f.ownerUser)
  })
})

const countSecrets = () =>
  f.gw.run(
    Effect.gen(function* () {
      const { names } = yield* Storage
      const kv = yield* Kv.make(
        names.kv.secrets.name,
        (yield* Effect.promise(() => import("../core/Secrets.ts"))).StoredSecret,
      )
      return (yield* kv.keys(`${f.account.id}.*`)).length
    }),
  )
