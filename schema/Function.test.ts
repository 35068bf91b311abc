import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { makeId } from "../core/Ids.ts"
import { timestamp } from "./Common.ts"
import { WebhookEvent } from "./Event.ts"
import { FunctionDetail, Version } from "./Function.ts"
import { emptyUsage, Run } from "./Run.ts"

const now = timestamp(Date.UTC(2026, 0, 1))
const version = {
  base: "debian-bookworm-20260101-0123456789ab",
  setup: ["apt-get install -y pandoc"],
  provider: `${makeId("prv")}@latest`,
  system_prompt: "p",
  tools: ["bash"],
  custom_tools: [
    {
      name: "lookup",
      description: "d",
      parameters: { type: "object", additionalProperties: false },
      url: "https://t.example.com",
      secret_id: makeId("sec"),
      timeout_seconds: 30,
    },
  ],
  input_manifest: [],
  output_manifest: [{ path: "a.md", max_bytes: 1 }],
  environment: [
    { name: "A", value: "1" },
    { name: "B", secret_id: makeId("sec") },
  ],
  size: "m",
  timeout_minutes: 30,
  function: makeId("fnc"),
  version: 1,
  created_at: now,
  created_by: makeId("usr"),
}
const run = {
  id: makeId("run"),
  account: makeId("acc"),
  function: version.function,
  version: 1,
  base: version.base,
  size: "m",
  provider: "none",
  prompt: "go",
  state: "queued",
  created_at: now,
  created_by: makeId("key"),
  usage: emptyUsage("m"),
}

describe("stored shapes", () => {
  it("a version keeps secrets only as ids", () => {
    expect(Schema.is(Version)(version)).toBe(true)
    const withSecret = { ...version, environment: [{ name: "A", secret: "s" }] }
    expect(Schema.decodeUnknownEither(Version)(withSecret, { onExcessProperty: "error" })._tag).toBe("Left")
  })

  it("a function detail holds the function and its versions", () => {
    const fn = {
      id: version.function,
      name: "fn",
      latest: 1,
      updated_at: now,
      updated_by: version.created_by,
    }
    expect(Schema.is(FunctionDetail)({ function: fn, versions: [version] })).toBe(true)
  })

  it("a run, and the webhook events carrying it", () => {
    expect(Schema.is(Run)(run)).toBe(true)
    expect(Schema.is(Run)({ ...run, created_at: "2026-01-01 00:00" })).toBe(false)
    expect(Schema.is(WebhookEvent)({ id: makeId("evt"), type: "run.failed", created: now, data: run })).toBe(
      true,
    )
    const command = {
      id: makeId("cmd"),
      run: run.id,
      kind: "get",
      state: "succeeded",
      source: "caller",
      sequence: 3,
      arguments: { path: "out/" },
      result: { download_url: "https://x.example/d" },
      created_at: now,
      ended_at: now,
    }
    const event = {
      id: makeId("evt"),
      type: "command.finished",
      created: now,
      data: { run: run.id, command },
    }
    expect(Schema.is(WebhookEvent)(event)).toBe(true)
  })
})
