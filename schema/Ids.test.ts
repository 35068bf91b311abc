import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { makeId } from "../core/Ids.ts"
import {
  AccountId,
  BaseName,
  CliLoginId,
  CommandId,
  EventId,
  FunctionId,
  ImageId,
  KeyId,
  LedgerEntryId,
  ProviderId,
  ProviderName,
  ProviderRef,
  ProviderRefInput,
  parseProviderRef,
  RunId,
  SecretId,
  UploadId,
  UserId,
} from "./Ids.ts"

describe("ids", () => {
  it.each([
    ["fnc", FunctionId],
    ["run", RunId],
    ["file", UploadId],
    ["prv", ProviderId],
    ["sec", SecretId],
    ["cmd", CommandId],
    ["evt", EventId],
    ["img", ImageId],
    ["acc", AccountId],
    ["usr", UserId],
    ["key", KeyId],
    ["login", CliLoginId],
    ["led", LedgerEntryId],
  ] as const)("%s ids made by core/Ids match, others do not", (prefix, schema) => {
    const is = Schema.is(schema as unknown as Schema.Schema<string, string>)
    expect(is(makeId(prefix))).toBe(true)
    expect(is(makeId(prefix === "run" ? "cmd" : "run"))).toBe(false)
    expect(is(`${prefix}_${"0".repeat(25)}`)).toBe(false)
    expect(is(`${prefix}_${"0".repeat(27)}`)).toBe(false)
    // Crockford base32 has no i, l, o, u; and ids are lowercase.
    expect(is(`${prefix}_${"0".repeat(25)}u`)).toBe(false)
    expect(is(`${prefix}_${"0".repeat(25)}A`)).toBe(false)
  })
})

describe("names", () => {
  it("takes base names as the base builder makes them", () => {
    expect(Schema.is(BaseName)("debian-bookworm-20260101-0123456789ab")).toBe(true)
    expect(Schema.is(BaseName)("debian-bookworm-2026011-0123456789ab")).toBe(false)
    expect(Schema.is(BaseName)("Debian-bookworm-20260101-0123456789ab")).toBe(false)
  })

  it("reserves the provider name none", () => {
    expect(Schema.is(ProviderName)("none")).toBe(false)
    expect(Schema.is(ProviderName)("a".repeat(40))).toBe(true)
    expect(Schema.is(ProviderName)("a".repeat(41))).toBe(false)
  })

  it("stores only id references (or none)", () => {
    const prv = makeId("prv")
    expect(Schema.is(ProviderRef)(`${prv}@2`)).toBe(true)
    expect(Schema.is(ProviderRef)(`${prv}@latest`)).toBe(true)
    expect(Schema.is(ProviderRef)("none")).toBe(true)
    expect(Schema.is(ProviderRef)("claude@latest")).toBe(false)
    expect(Schema.is(ProviderRefInput)("claude@latest")).toBe(true)
  })

  it("parses references, a bare name meaning latest", () => {
    const prv = makeId("prv")
    expect(parseProviderRef(`${prv}@7`)).toEqual({ provider: prv, isId: true, version: 7 })
    expect(parseProviderRef("claude")).toEqual({ provider: "claude", isId: false, version: "latest" })
    expect(parseProviderRef("claude@latest")).toEqual({ provider: "claude", isId: false, version: "latest" })
  })
})
