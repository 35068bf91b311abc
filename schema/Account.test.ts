import { describe, expect, it } from "vitest"
import { CheckoutRequest, CliLoginRequest, CreateInviteRequest, CreateKeyRequest } from "./Account.ts"
import { CatalogRequest, CreateProviderRequest } from "./Provider.ts"
import { refusal } from "./testing.ts"
import { UploadRequest } from "./Upload.ts"

type Row = readonly [label: string, body: unknown, expected: string | null]
const check = (message: string | undefined, expected: string | null) => {
  if (expected === null) expect(message).toBeUndefined()
  else expect(message?.startsWith(expected) ? expected : message).toBe(expected)
}

const model = (extra: Record<string, unknown>) => ({
  provider: "openai",
  model: "gpt-x",
  compact_at_tokens: 8000,
  ...extra,
})

describe("provider requests", () => {
  it.each<Row>([
    ["openai at 8000 tokens", { name: "main", model: model({}), key: "k" }, null],
    [
      "openai at 7999 tokens",
      { name: "main", model: model({ compact_at_tokens: 7999 }), key: "k" },
      "model.compact_at_tokens: must be an integer of at least 8000",
    ],
    [
      "anthropic at 50000 tokens",
      { name: "main", model: model({ provider: "anthropic", compact_at_tokens: 50_000 }), key: "k" },
      null,
    ],
    [
      "anthropic at 49999 tokens",
      { name: "main", model: model({ provider: "anthropic", compact_at_tokens: 49_999 }), key: "k" },
      "model.compact_at_tokens: must be at least 50000 for anthropic",
    ],
    [
      "unknown vendor",
      { name: "main", model: model({ provider: "mistral" }), key: "k" },
      "model.provider: must be one of openai, anthropic, google",
    ],
    [
      "max_output_tokens -1",
      { name: "main", model: model({ max_output_tokens: -1 }), key: "k" },
      "model.max_output_tokens: must be an integer of at least 0",
    ],
    ["no key", { name: "main", model: model({}) }, "key: is required"],
    ["empty key", { name: "main", model: model({}), key: "" }, "key: must not be empty"],
    [
      "key of 4097 bytes",
      { name: "main", model: model({}), key: "k".repeat(4097) },
      "key: at most 4096 bytes",
    ],
    ["name none", { name: "none", model: model({}), key: "k" }, "name: `none` is reserved"],
    ["name of 41 characters", { name: "a".repeat(41), model: model({}), key: "k" }, "name: must match"],
  ])("%s", (_label, body, expected) => check(refusal(CreateProviderRequest)(body), expected))

  it("catalog needs a vendor and a key", () => {
    check(refusal(CatalogRequest)({ provider: "google", key: "k" }), null)
    check(refusal(CatalogRequest)({ provider: "google" }), "key: is required")
  })
})

describe("account requests", () => {
  const fnc = `fnc_${"0".repeat(26)}`
  it.each<Row>([
    ["checkout of $5", { amount_usd_cents: 500 }, null],
    ["checkout of $500", { amount_usd_cents: 50_000 }, null],
    [
      "checkout of $4.99",
      { amount_usd_cents: 499 },
      "amount_usd_cents: must be an integer from 500 to 50000",
    ],
    [
      "checkout of $500.01",
      { amount_usd_cents: 50_001 },
      "amount_usd_cents: must be an integer from 500 to 50000",
    ],
  ])("%s", (_label, body, expected) => check(refusal(CheckoutRequest)(body), expected))

  it.each<Row>([
    ["admin key", { name: "ci", scope: "admin" }, null],
    ["admin key with *", { name: "ci", scope: "admin", functions: ["*"] }, null],
    [
      "admin key with a function",
      { name: "ci", scope: "admin", functions: [fnc] },
      "functions: an admin key reaches every function",
    ],
    ["run key for all", { name: "ci", scope: "run", functions: ["*"] }, null],
    ["run key for one", { name: "ci", scope: "run", functions: [fnc] }, null],
    [
      "run key without functions",
      { name: "ci", scope: "run" },
      "functions: a run key must name its functions",
    ],
    [
      "run key with * and more",
      { name: "ci", scope: "run", functions: ["*", fnc] },
      "functions: * already means every function",
    ],
    [
      "run key with a bad id",
      { name: "ci", scope: "run", functions: ["fn"] },
      "functions[0]: must be a fnc_ id or *",
    ],
    ["owner scope", { name: "ci", scope: "owner" }, "scope: must be one of admin, run"],
    ["name of 257 bytes", { name: "n".repeat(257), scope: "admin" }, "name: at most 256 bytes"],
  ])("%s", (_label, body, expected) => check(refusal(CreateKeyRequest)(body), expected))

  it.each<Row>([
    ["invite", { email: "a@example.com", role: "member" }, null],
    ["invite without @", { email: "a.example.com", role: "member" }, "email: must be an e-mail address"],
    ["invite as admin", { email: "a@example.com", role: "admin" }, "role: must be one of owner, member"],
  ])("%s", (_label, body, expected) => check(refusal(CreateInviteRequest)(body), expected))

  it.each<Row>([
    ["cli login", { name: "laptop", key_hash: "a".repeat(64) }, null],
    [
      "cli login with upper-case hash",
      { name: "laptop", key_hash: "A".repeat(64) },
      "key_hash: must be 64 lowercase hexadecimal",
    ],
    [
      "cli login with a short hash",
      { name: "laptop", key_hash: "a".repeat(63) },
      "key_hash: must be 64 lowercase hexadecimal",
    ],
  ])("%s", (_label, body, expected) => check(refusal(CliLoginRequest)(body), expected))
})

describe("UploadRequest", () => {
  const sha256 = "0".repeat(64)
  it.each<Row>([
    ["0 bytes", { bytes: 0, sha256 }, null],
    ["5 GB", { bytes: 5_000_000_000, sha256 }, null],
    ["5 GB + 1", { bytes: 5_000_000_001, sha256 }, "bytes: must be an integer from 0 to 5000000000"],
    ["-1 bytes", { bytes: -1, sha256 }, "bytes: must be an integer from 0"],
    ["no sha256", { bytes: 1 }, "sha256: is required"],
    [
      "sha256 of 65 characters",
      { bytes: 1, sha256: `${sha256}0` },
      "sha256: must be 64 lowercase hexadecimal",
    ],
  ])("%s", (_label, body, expected) => check(refusal(UploadRequest)(body), expected))
})
