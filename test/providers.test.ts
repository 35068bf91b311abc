/**
 * Providers, the catalog, bases, the tools list and the OpenAPI document through real HTTP against
 * a gateway over a real nats-server and the three vendor fakes: keys checked with the vendor and
 * never returned, logged or stored in clear; vendor failures mapped (rejected key 400 naming
 * `key`, vendor down 502); versions newest first; the access label of every route of the group.
 */
import { Schema } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { routes as groupRoutes } from "../gateway/functions/group.ts"
import {
  call,
  type Fixture,
  type Json,
  rawKvText,
  startFixture,
  vendorKey,
} from "../gateway/functions/testing.ts"
import { routesFor } from "../gateway/openapi/OpenApi.ts"
import { BashArguments } from "../schema/Command.ts"
import { CreateFunctionRequest } from "../schema/Definition.ts"
import { inputSchemaOf } from "../schema/Tools.ts"
import * as AnthropicFake from "./fakes/AnthropicFake.ts"
import * as GoogleFake from "./fakes/GoogleFake.ts"
import * as OpenAiFake from "./fakes/OpenAiFake.ts"

const routes = [...groupRoutes, ...routesFor(groupRoutes)]
const WRONG_KEY = "sk-proj-WRONGCANARY0123456789abcdefQRST"

let f: Fixture
const post = (path: string, body: unknown, headers = f.admin) => call(f.gw, "POST", path, headers, body)
const get = (path: string, headers = f.admin) => call(f.gw, "GET", path, headers)
const openaiModel = (over: Record<string, unknown> = {}) => ({
  provider: "openai",
  model: "gpt-5",
  compact_at_tokens: 200_000,
  ...over,
})
const expectError = (res: { status: number; body: Json }, status: number, code: string, field?: string) => {
  expect({ status: res.status, code: res.body.code }).toEqual({ status, code })
  if (field) expect(res.body.error.startsWith(`${field}:`), res.body.error).toBe(true)
}

beforeAll(async () => {
  f = await startFixture(routes)
})

afterAll(async () => {
  await f?.close()
})

describe("providers", () => {
  it("a provider is published after the vendor accepts the key and model; the key is never returned", async () => {
    const res = await post("/v1/providers", {
      name: "main",
      model: openaiModel({ reasoning_effort: "high" }),
      key: vendorKey,
      external_reference: "ext-1",
    })
    expect(res.status, res.text).toBe(201)
    expect(res.body).toEqual({
      id: expect.stringMatching(/^prv_/),
      version: 1,
      name: "main",
      model: {
        provider: "openai",
        model: "gpt-5",
        reasoning_effort: "high",
        compact_at_tokens: 200_000,
        max_output_tokens: 0,
      },
      external_reference: "ext-1",
      created_at: expect.any(String),
      created_by: expect.stringMatching(/^key_/),
    })
    expect(f.openai.requests.at(-1)?.headers.authorization).toBe(`Bearer ${vendorKey}`)
    const v2 = await post(`/v1/providers/${res.body.id}/versions`, {
      model: openaiModel({ model: "o3" }),
      key: vendorKey,
    })
    expect(v2.status, v2.text).toBe(201)
    expect(v2.body).toMatchObject({
      id: res.body.id,
      version: 2,
      name: "main",
      model: { model: "o3", reasoning_effort: "" },
    })
    const later = (
      await post("/v1/providers", {
        name: "later",
        model: { provider: "google", model: "gemini-2.5-pro", compact_at_tokens: 8000 },
        key: vendorKey,
      })
    ).body
    const list = await get("/v1/providers")
    expect(list.status).toBe(200)
    const ids = list.body.providers.map((p: Json) => p.id)
    expect(ids.indexOf(later.id)).toBeLessThan(ids.indexOf(res.body.id))
    const main = list.body.providers.find((p: Json) => p.id === res.body.id)
    expect(main).toMatchObject({ name: "main", latest: 2 })
    expect(main.versions.map((v: Json) => v.version)).toEqual([2, 1])
    expect(main.versions[1]).toEqual(res.body)
  })

  it("the model's catalog entry decides the effort and output limit; the vendor's refusals name the field", async () => {
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: openaiModel({ reasoning_effort: "xhigh" }),
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.reasoning_effort",
    )
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: openaiModel({ model: "gpt-4.1", reasoning_effort: "low" }),
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.reasoning_effort",
    )
    expect(
      (
        await post("/v1/providers", {
          name: "x",
          model: openaiModel({ max_output_tokens: 128_000 }),
          key: vendorKey,
        })
      ).status,
    ).toBe(201)
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: openaiModel({ max_output_tokens: 128_001 }),
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.max_output_tokens",
    )
    // OpenAI's own floor: 1 to 15 would fail every call of every run, so the provider is refused.
    for (const tooFew of [1, 15]) {
      const refused = await post("/v1/providers", {
        name: "x",
        model: openaiModel({ max_output_tokens: tooFew }),
        key: vendorKey,
      })
      expectError(refused, 400, "invalid_request", "model.max_output_tokens")
      expect(refused.body.error).toContain("at least 16")
    }
    expect(
      (
        await post("/v1/providers", {
          name: "x",
          model: openaiModel({ max_output_tokens: 16 }),
          key: vendorKey,
        })
      ).status,
    ).toBe(201)
    expectError(
      await post("/v1/providers", { name: "x", model: openaiModel({ model: "gpt-9" }), key: vendorKey }),
      400,
      "invalid_request",
      "model.model",
    )
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: openaiModel({ model: "text-embedding-3-small" }),
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.model",
    )
    expectError(
      await post("/v1/providers", { name: "x", model: openaiModel(), key: WRONG_KEY }),
      400,
      "invalid_request",
      "key",
    )
    // The schema's rules come first, without a call to the vendor.
    const calls = f.anthropic.requests.length
    const claude = { provider: "anthropic", model: "claude-sonnet-4-5-20250929" }
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: { ...claude, compact_at_tokens: 49_999 },
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.compact_at_tokens",
    )
    expect(f.anthropic.requests.length).toBe(calls)
    expect(
      (
        await post("/v1/providers", {
          name: "x",
          model: { ...claude, compact_at_tokens: 50_000 },
          key: vendorKey,
        })
      ).status,
    ).toBe(201)
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: openaiModel({ compact_at_tokens: 7999 }),
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.compact_at_tokens",
    )
    expectError(
      await post("/v1/providers", { name: "none", model: openaiModel(), key: vendorKey }),
      400,
      "invalid_request",
      "name",
    )
    expectError(
      await post("/v1/providers", { name: "x", model: openaiModel(), key: "" }),
      400,
      "invalid_request",
      "key",
    )
    expectError(
      await post("/v1/providers", {
        name: "x",
        model: { ...openaiModel(), provider: "mistral" },
        key: vendorKey,
      }),
      400,
      "invalid_request",
      "model.provider",
    )
  })

  it("a vendor that is down is 502 and nothing is stored; an unknown provider's version is 404", async () => {
    const before = (await get("/v1/providers")).body.providers.length
    f.openai.failNext(1, OpenAiFake.serverError())
    expectError(
      await post("/v1/providers", { name: "down", model: openaiModel(), key: vendorKey }),
      502,
      "vendor_unavailable",
    )
    expect((await get("/v1/providers")).body.providers.length).toBe(before)
    const calls = f.openai.requests.length
    expectError(
      await post("/v1/providers/prv_00000000000000000000000000/versions", {
        model: openaiModel(),
        key: vendorKey,
      }),
      404,
      "not_found",
    )
    expect(f.openai.requests.length).toBe(calls)
  })
})

describe("catalog", () => {
  it("lists each vendor's models for the key", async () => {
    const openai = await post("/v1/catalog", { provider: "openai", key: vendorKey })
    expect(openai.status).toBe(200)
    expect(openai.body.models.map((m: Json) => m.id)).toEqual(["gpt-4.1", "gpt-5", "o3"])
    expect(openai.body.models.find((m: Json) => m.id === "gpt-5")).toEqual({
      id: "gpt-5",
      name: "GPT-5",
      context_window: 400_000,
      max_output_tokens: 128_000,
      efforts: ["minimal", "low", "medium", "high"],
      default_effort: "medium",
    })
    const anthropic = await post("/v1/catalog", { provider: "anthropic", key: vendorKey })
    expect(anthropic.body.models).toEqual([
      expect.objectContaining({ id: "claude-sonnet-4-5-20250929", name: "Claude Sonnet 4.5" }),
    ])
    const google = await post("/v1/catalog", { provider: "google", key: vendorKey })
    expect(google.body.models).toEqual([
      expect.objectContaining({ id: "gemini-2.5-pro", context_window: 1_048_576, max_output_tokens: 65_536 }),
    ])
  })

  it("a rejected key is 400 naming key at each vendor; a vendor down is 502", async () => {
    for (const provider of ["openai", "anthropic", "google"]) {
      expectError(await post("/v1/catalog", { provider, key: WRONG_KEY }), 400, "invalid_request", "key")
    }
    f.openai.failNext(1, OpenAiFake.rateLimited())
    expectError(await post("/v1/catalog", { provider: "openai", key: vendorKey }), 502, "vendor_unavailable")
    f.anthropic.failNext(1, AnthropicFake.overloaded())
    expectError(
      await post("/v1/catalog", { provider: "anthropic", key: vendorKey }),
      502,
      "vendor_unavailable",
    )
    f.google.failNext(1, GoogleFake.unavailable())
    expectError(await post("/v1/catalog", { provider: "google", key: vendorKey }), 502, "vendor_unavailable")
    expectError(await post("/v1/catalog", { provider: "openai" }), 400, "invalid_request", "key")
  })

  it("vendor keys appear in no response, log line or KV value in clear", async () => {
    const texts = [
      (await get("/v1/providers")).text,
      (await post("/v1/catalog", { provider: "openai", key: WRONG_KEY })).text,
      (await post("/v1/providers", { name: "x", model: openaiModel(), key: WRONG_KEY })).text,
      (
        await post("/v1/providers", {
          name: "x",
          model: openaiModel(),
          key: `${"k".repeat(5000)}${vendorKey}`,
        })
      ).text,
    ]
    const kv = await rawKvText(f.gw)
    expect(kv).toContain("vendor")
    const all = [...texts, kv, ...f.gw.lines].join("\n")
    expect(f.gw.lines.some((l) => l.includes("vendor catalog failed"))).toBe(true)
    for (const c of [vendorKey, WRONG_KEY, "CANARY", WRONG_KEY.slice(-4), vendorKey.slice(-4)])
      expect(all).not.toContain(c)
  })
})

describe("bases", () => {
  it("lists the live hosts' bases once each, newest first", async () => {
    await f.putHost("h1", ["debian-bookworm-20250101-0123456789ab", "debian-trixie-20260301-bbbbbbbbbbbb"])
    await f.putHost("h2", ["debian-trixie-20260301-bbbbbbbbbbbb", "debian-trixie-20260101-abcdef012345"])
    await f.putHost("old", ["debian-sid-20270101-cccccccccccc"], { stale: true })
    const res = await get("/v1/bases", f.runAll)
    expect(res.status).toBe(200)
    expect(res.body.bases.map((b: Json) => b.name)).toEqual([
      "debian-trixie-20260301-bbbbbbbbbbbb",
      "debian-trixie-20260101-abcdef012345",
      "debian-bookworm-20250101-0123456789ab",
    ])
    expect(res.body.bases[0]).toEqual({
      name: "debian-trixie-20260301-bbbbbbbbbbbb",
      sha256: "a".repeat(64),
      bytes: 1_000_000,
    })
  })
})

describe("tools", () => {
  it("lists the eight tools with input schemas generated from the command schemas", async () => {
    const res = await get("/v1/tools", f.runAll)
    expect(res.status).toBe(200)
    const tools = res.body.tools as Array<Json>
    expect(tools.map((t) => t.name)).toEqual([
      "bash",
      "read",
      "write",
      "edit",
      "screenshot",
      "web_search",
      "complete",
      "give_up",
    ])
    for (const t of tools) {
      expect(t.description.length).toBeGreaterThan(10)
      expect(t.input_schema).toMatchObject({ type: "object", additionalProperties: false })
      expect(JSON.stringify(t.input_schema)).not.toContain("$ref")
    }
    const bash = tools[0]
    expect(bash.input_schema).toEqual(inputSchemaOf(BashArguments))
    expect(bash.input_schema.required).toEqual(["command"])
    expect(Object.keys(bash.input_schema.properties)).toEqual(["command", "workdir", "timeout_ms", "env"])
    expect(tools.find((t) => t.name === "edit").input_schema.properties.edits.minItems).toBe(1)
    expect(tools.find((t) => t.name === "screenshot").input_schema).toEqual({
      type: "object",
      properties: {},
      additionalProperties: false,
    })
    expect(tools.find((t) => t.name === "give_up").input_schema.required).toEqual(["reason"])
  })
})

describe("OpenAPI document", () => {
  it("describes every route served, with bodies from the route schemas and the access labels", async () => {
    const res = await call(f.gw, "GET", "/v1/openapi.json", {})
    expect(res.status).toBe(200)
    const doc = res.body
    expect(doc.openapi).toBe("3.1.0")
    const served = routes.map((r) => `${r.method} ${r.path.replace(/:(\w+)/g, "{$1}")}`).sort()
    const documented = Object.entries(doc.paths as Record<string, Record<string, unknown>>)
      .flatMap(([path, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${path}`))
      .sort()
    expect(documented).toEqual(served)
    const create = doc.paths["/v1/functions"].post
    expect(create["x-access"]).toBe("member (admin keys)")
    expect(create.requestBody.content["application/json"].schema).toEqual({
      $ref: "#/components/schemas/CreateFunctionRequest",
    })
    const schema = doc.components.schemas.CreateFunctionRequest
    expect(schema.required).toEqual(expect.arrayContaining(["name", "system_prompt", "output_manifest"]))
    expect(schema.required).not.toContain("tools")
    expect(Object.keys(schema.properties).sort()).toEqual(Object.keys(CreateFunctionRequest.fields).sort())
    expect(create.responses["201"].content["application/json"].schema).toEqual({
      $ref: "#/components/schemas/Version",
    })
    expect(doc.paths["/v1/functions/{id}/versions"].post.parameters[0]).toMatchObject({
      name: "id",
      in: "path",
    })
    expect(doc.paths["/v1/tools"].get["x-access"]).toBe("member")
    expect(doc.paths["/v1/openapi.json"].get["x-access"]).toBe("anyone")
    expect(doc.components.schemas.ErrorBody).toBeDefined()
    expect(Schema.is(Schema.Struct({ openapi: Schema.String }))(doc)).toBe(true)
  })
})

describe("access labels", () => {
  // [method, path, body, outcome for: no credential, run key, admin key, owner, member person]
  type Row = readonly [string, string, unknown, readonly [number, number, number, number, number]]
  const U = 401
  const KS = 403
  const minimal = { name: "fn", provider: "none", system_prompt: "x", output_manifest: [{ path: "o" }] }
  const rows: ReadonlyArray<Row> = [
    ["GET", "/v1/bases", undefined, [U, 200, 200, 200, 200]],
    ["GET", "/v1/functions", undefined, [U, 200, 200, 200, 200]],
    ["POST", "/v1/functions", minimal, [U, KS, 201, 201, 201]],
    ["GET", "/v1/tools", undefined, [U, 200, 200, 200, 200]],
    ["GET", "/v1/providers", undefined, [U, KS, 200, 200, 200]],
    ["POST", "/v1/catalog", { provider: "openai", key: vendorKey }, [U, KS, 200, 200, 200]],
    ["POST", "/v1/providers", { name: "p", model: openaiModel(), key: vendorKey }, [U, KS, 201, 201, 201]],
    ["GET", "/v1/openapi.json", undefined, [200, 200, 200, 200, 200]],
  ]
  let member: Record<string, string>
  beforeAll(async () => {
    await f.putHost("h1", ["debian-bookworm-20250101-0123456789ab"])
    await f.gw.run(f.gw.accounts.invite(f.account, "member@example.com", "member", f.ownerUser))
    const user = await f.gw.run(f.gw.accounts.ensureUser("member@example.com"))
    await f.gw.run(f.gw.accounts.acceptInvite(f.account.id, user))
    const { personToken } = await import("../gateway/auth/testing.ts")
    member = {
      authorization: `Bearer ${await personToken(f.keyFile, "member@example.com")}`,
      "service-account": f.account.id,
    }
  })
  for (const [method, path, body, outcomes] of rows) {
    it(`${method} ${path}: none ${outcomes[0]}, run key ${outcomes[1]}, admin key ${outcomes[2]}, owner ${outcomes[3]}, member ${outcomes[4]}`, async () => {
      const callers = [{}, f.runAll, f.admin, f.owner, member]
      const got = []
      for (const headers of callers) got.push((await call(f.gw, method, path, headers, body)).status)
      expect(got).toEqual([...outcomes])
    })
  }
  it("the function-scoped routes: a version and a read", async () => {
    const fn = (await post("/v1/functions", minimal)).body.function
    const got = []
    for (const headers of [{}, f.runAll, f.admin, f.owner, member]) {
      got.push((await call(f.gw, "GET", `/v1/functions/${fn}`, headers)).status)
      got.push(
        (await call(f.gw, "POST", `/v1/functions/${fn}/versions`, headers, { ...minimal, name: undefined }))
          .status,
      )
      got.push(
        (
          await call(f.gw, "POST", "/v1/providers/prv_00000000000000000000000000/versions", headers, {
            model: openaiModel(),
            key: vendorKey,
          })
        ).status,
      )
    }
    expect(got).toEqual([U, U, U, 200, KS, KS, 200, 201, 404, 200, 201, 404, 200, 201, 404])
  })
})
