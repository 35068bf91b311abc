import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { decodeBodyEither } from "./Decode.ts"
import { CreateFunctionRequest, openObjectAt, PublishVersionRequest } from "./Definition.ts"
import { inputMaxBytesDefault, outputMaxBytes } from "./Limits.ts"

const id = (prefix: string) => `${prefix}_${"0".repeat(26)}`
const secretId = id("sec")
const closed = { type: "object", properties: {}, additionalProperties: false }
// A patch value of `undefined` removes the field (JSON has no undefined).
const withPatch = (base: Record<string, unknown>, patch: Record<string, unknown>) => {
  const out: Record<string, unknown> = { ...base, ...patch }
  for (const [k, v] of Object.entries(patch)) if (v === undefined) delete out[k]
  return out
}
const tool = (extra: Record<string, unknown> = {}) =>
  withPatch(
    {
      name: "lookup",
      description: "look it up",
      parameters: closed,
      url: "https://tools.example.com/lookup",
      secret: "s3cret",
    },
    extra,
  )
const entry = (path: string, extra: Record<string, unknown> = {}) => ({ path, ...extra })
const env = (name: string, extra: Record<string, unknown> = { value: "v" }) => ({ name, ...extra })
const minimal = { name: "fn", system_prompt: "do it", output_manifest: [entry("report.md")] }
const times = <A>(n: number, f: (i: number) => A): Array<A> => Array.from({ length: n }, (_, i) => f(i))

const decode = decodeBodyEither(CreateFunctionRequest)
/** The error message, or undefined when the body decodes. */
const failure = (body: unknown): string | undefined => {
  const r = decode(body)
  if (Either.isRight(r)) return undefined
  expect(r.left.code).toBe("invalid_request")
  expect(r.left.status).toBe(400)
  return r.left.message
}
const decoded = (body: unknown) => {
  const r = decode(body)
  if (Either.isLeft(r)) throw new Error(`expected to decode, got: ${r.left.message}`)
  return r.right
}

// Each row: a change to the minimal body, and either null (decodes) or the start of the message.
type Row = readonly [label: string, patch: Record<string, unknown>, expected: string | null]

const rows: ReadonlyArray<Row> = [
  // name
  ["name of 40 characters", { name: "a".repeat(40) }, null],
  ["name of 41 characters", { name: "a".repeat(41) }, "name: must match"],
  ["name starting with -", { name: "-a" }, "name: must match"],
  ["empty name", { name: "" }, "name: must match"],
  ["name with capitals", { name: "Fn" }, "name: must match"],
  // external_reference: bytes
  ["external_reference of 256 bytes (2-byte chars)", { external_reference: "é".repeat(128) }, null],
  [
    "external_reference of 257 bytes",
    { external_reference: `${"é".repeat(128)}a` },
    "external_reference: at most 256 bytes",
  ],
  // setup
  ["64 setup commands", { setup: times(64, () => "true") }, null],
  ["65 setup commands", { setup: times(65, () => "true") }, "setup: at most 64 items"],
  ["setup command of 16384 bytes", { setup: ["a", "b", "c", "x".repeat(16384)] }, null],
  [
    "setup command of 16385 bytes",
    { setup: ["a", "b", "c", "x".repeat(16385)] },
    "setup[3]: at most 16384 bytes",
  ],
  ["setup command of 16384 bytes in 2-byte chars", { setup: ["é".repeat(8192)] }, null],
  [
    "setup command of 8192 2-byte chars and one more",
    { setup: [`${"é".repeat(8192)}a`] },
    "setup[0]: at most 16384 bytes",
  ],
  ["setup not an array", { setup: "true" }, "setup: must be an array"],
  // system_prompt
  ["system_prompt of 65536 bytes", { system_prompt: "x".repeat(65536) }, null],
  [
    "system_prompt of 65537 bytes",
    { system_prompt: "x".repeat(65537) },
    "system_prompt: at most 65536 bytes",
  ],
  ["system_prompt of 21845 3-byte chars", { system_prompt: "€".repeat(21845) }, null],
  [
    "system_prompt of 21845 3-byte chars and 2 bytes",
    { system_prompt: `${"€".repeat(21845)}é` },
    "system_prompt: at most 65536 bytes",
  ],
  ["system_prompt missing", { system_prompt: undefined }, "system_prompt: is required"],
  // tools
  ["no tools", { tools: [] }, null],
  ["every tool", { tools: ["bash", "read", "write", "edit", "screenshot", "web_search"] }, null],
  ["unknown tool", { tools: ["bash", "python"] }, "tools[1]: must be one of bash, read"],
  ["tool twice", { tools: ["bash", "bash"] }, 'tools[1]: tool "bash" is given twice'],
  // custom_tools
  ["16 custom tools", { custom_tools: times(16, (i) => tool({ name: `t${i}` })) }, null],
  [
    "17 custom tools",
    { custom_tools: times(17, (i) => tool({ name: `t${i}` })) },
    "custom_tools: at most 16 items",
  ],
  ["tool name of 64 characters", { custom_tools: [tool({ name: `a${"b".repeat(63)}` })] }, null],
  [
    "tool name of 65 characters",
    { custom_tools: [tool({ name: `a${"b".repeat(64)}` })] },
    "custom_tools[0].name: must match ^[a-z][a-z0-9_]{0,63}$",
  ],
  [
    "tool name starting with a digit",
    { custom_tools: [tool({ name: "1a" })] },
    "custom_tools[0].name: must match",
  ],
  ["tool name with capitals", { custom_tools: [tool({ name: "Look" })] }, "custom_tools[0].name: must match"],
  [
    "tool named like a built-in",
    { custom_tools: [tool({ name: "submit_result" })] },
    "custom_tools[0].name: submit_result is the name of a built-in tool",
  ],
  [
    "two tools with one name",
    { custom_tools: [tool(), tool()] },
    'custom_tools[1]: custom tool name "lookup" is given twice',
  ],
  ["tool timeout 1", { custom_tools: [tool({ timeout_seconds: 1 })] }, null],
  ["tool timeout 600", { custom_tools: [tool({ timeout_seconds: 600 })] }, null],
  [
    "tool timeout 0",
    { custom_tools: [tool({ timeout_seconds: 0 })] },
    "custom_tools[0].timeout_seconds: must be an integer from 1 to 600",
  ],
  [
    "tool timeout 601",
    { custom_tools: [tool({ timeout_seconds: 601 })] },
    "custom_tools[0].timeout_seconds: must be an integer from 1 to 600",
  ],
  [
    "tool timeout 1.5",
    { custom_tools: [tool({ timeout_seconds: 1.5 })] },
    "custom_tools[0].timeout_seconds: must be an integer",
  ],
  [
    "tool url http",
    { custom_tools: [tool({ url: "http://tools.example.com/" })] },
    "custom_tools[0].url: must be an https:// URL",
  ],
  [
    "tool url not a URL",
    { custom_tools: [tool({ url: "tools.example.com" })] },
    "custom_tools[0].url: must be an absolute https:// URL",
  ],
  [
    "tool url with credentials",
    { custom_tools: [tool({ url: "https://u:p@example.com/" })] },
    "custom_tools[0].url: must not carry",
  ],
  [
    "tool description missing",
    { custom_tools: [tool({ description: undefined })] },
    "custom_tools[0].description: is required",
  ],
  ["tool secret of 4096 bytes", { custom_tools: [tool({ secret: "s".repeat(4096) })] }, null],
  [
    "tool secret of 4097 bytes",
    { custom_tools: [tool({ secret: "s".repeat(4097) })] },
    "custom_tools[0].secret: at most 4096 bytes",
  ],
  [
    "tool secret_id instead of secret",
    { custom_tools: [tool({ secret: undefined, secret_id: secretId })] },
    null,
  ],
  [
    "tool secret and secret_id",
    { custom_tools: [tool({ secret_id: secretId })] },
    "custom_tools[0].secret_id: give secret or secret_id, not both",
  ],
  [
    "tool without a secret",
    { custom_tools: [tool({ secret: undefined })] },
    "custom_tools[0].secret: is required",
  ],
  [
    "tool secret_id of another kind",
    { custom_tools: [tool({ secret: undefined, secret_id: id("key") })] },
    "custom_tools[0].secret_id: must be a sec_ id",
  ],
  [
    "tool with an unknown field",
    { custom_tools: [tool({ headers: {} })] },
    "custom_tools[0].headers: unknown field",
  ],
  [
    "parameters not an object schema",
    { custom_tools: [tool({ parameters: { type: "string" } })] },
    'custom_tools[0].parameters.type: must be "object"',
  ],
  [
    "parameters open at the root",
    { custom_tools: [tool({ parameters: { type: "object" } })] },
    "custom_tools[0].parameters: must set additionalProperties to false",
  ],
  [
    "parameters open in a property",
    {
      custom_tools: [
        tool({ parameters: { ...closed, properties: { a: { type: "object", properties: {} } } } }),
      ],
    },
    "custom_tools[0].parameters.properties.a: must set additionalProperties to false",
  ],
  [
    "parameters open in array items",
    {
      custom_tools: [
        tool({ parameters: { ...closed, properties: { a: { type: "array", items: { type: "object" } } } } }),
      ],
    },
    "custom_tools[0].parameters.properties.a.items: must set additionalProperties to false",
  ],
  [
    "parameters open in anyOf",
    {
      custom_tools: [
        tool({
          parameters: { ...closed, properties: { a: { anyOf: [{ type: "string" }, { properties: {} }] } } },
        }),
      ],
    },
    "custom_tools[0].parameters.properties.a.anyOf[1]: must set additionalProperties to false",
  ],
  [
    "parameters closed everywhere",
    {
      custom_tools: [
        tool({
          parameters: {
            ...closed,
            properties: { a: { type: "array", items: closed }, b: { type: "string" } },
          },
        }),
      ],
    },
    null,
  ],
  // input_manifest
  ["64 input entries", { input_manifest: times(64, (i) => entry(`f${i}`)) }, null],
  [
    "65 input entries",
    { input_manifest: times(65, (i) => entry(`f${i}`)) },
    "input_manifest: at most 64 items",
  ],
  [
    "input description of 2000 bytes",
    { input_manifest: [entry("a", { description: "é".repeat(1000) })] },
    null,
  ],
  [
    "input description of 2001 bytes",
    { input_manifest: [entry("a", { description: `${"é".repeat(1000)}a` })] },
    "input_manifest[0].description: at most 2000 bytes",
  ],
  ["input folder entry", { input_manifest: [entry("data/")] }, null],
  [
    "input path absolute",
    { input_manifest: [entry("/etc/passwd")] },
    "input_manifest[0].path: must be relative",
  ],
  [
    "input path with ..",
    { input_manifest: [entry("a/../../b")] },
    "input_manifest[0].path: must not contain empty, . or .. segments",
  ],
  ["input path empty", { input_manifest: [entry("")] }, "input_manifest[0].path: must not be empty"],
  [
    "input path twice",
    { input_manifest: [entry("a"), entry("a")] },
    'input_manifest[1]: path "a" is given twice',
  ],
  ["input max_bytes 0", { input_manifest: [entry("a", { max_bytes: 0 })] }, null],
  [
    "input max_bytes -1",
    { input_manifest: [entry("a", { max_bytes: -1 })] },
    "input_manifest[0].max_bytes: must be an integer from 0",
  ],
  // output_manifest
  ["no output entry", { output_manifest: [] }, "output_manifest: at least one entry is required"],
  ["output_manifest missing", { output_manifest: undefined }, "output_manifest: is required"],
  ["64 output entries", { output_manifest: times(64, (i) => entry(`f${i}`)) }, null],
  [
    "65 output entries",
    { output_manifest: times(65, (i) => entry(`f${i}`)) },
    "output_manifest: at most 64 items",
  ],
  ["output max_bytes 50 GiB", { output_manifest: [entry("a", { max_bytes: outputMaxBytes })] }, null],
  [
    "output max_bytes 50 GiB + 1",
    { output_manifest: [entry("a", { max_bytes: outputMaxBytes + 1 })] },
    "output_manifest[0].max_bytes: must be an integer from 0 to 53687091200",
  ],
  [
    "output description of 2001 bytes",
    { output_manifest: [entry("a", { description: "d".repeat(2001) })] },
    "output_manifest[0].description: at most 2000 bytes",
  ],
  // environment
  ["64 variables", { environment: times(64, (i) => env(`V${i}`)) }, null],
  ["65 variables", { environment: times(65, (i) => env(`V${i}`)) }, "environment: at most 64 items"],
  ["value of 65536 bytes", { environment: [env("A", { value: "v".repeat(65536) })] }, null],
  [
    "value of 65537 bytes",
    { environment: [env("A", { value: "v".repeat(65537) })] },
    "environment[0].value: at most 65536 bytes",
  ],
  [
    "value of 32768 2-byte chars and one more",
    { environment: [env("A", { value: `${"é".repeat(32768)}a` })] },
    "environment[0].value: at most 65536 bytes",
  ],
  ["secret of 4096 bytes", { environment: [env("A", { secret: "s".repeat(4096) })] }, null],
  [
    "secret of 4097 bytes",
    { environment: [env("A", { secret: "s".repeat(4097) })] },
    "environment[0].secret: at most 4096 bytes",
  ],
  ["secret_id", { environment: [env("A", { secret_id: secretId })] }, null],
  ["empty value", { environment: [env("A", { value: "" })] }, null],
  ["no value", { environment: [env("A", {})] }, "environment[0].value: is required"],
  [
    "value and secret",
    { environment: [env("A", { value: "v", secret: "s" })] },
    "environment[0].secret: give only one of value, secret and secret_id",
  ],
  [
    "secret and secret_id",
    { environment: [env("A", { secret: "s", secret_id: secretId })] },
    "environment[0].secret_id: give only one",
  ],
  [
    "name with the reserved prefix",
    { environment: [env("SERVICE_KEY")] },
    "environment[0].name: must not start with SERVICE_",
  ],
  ["name like the prefix in lower case", { environment: [env("service_key")] }, null],
  ["name starting with a digit", { environment: [env("1A")] }, "environment[0].name: must match"],
  ["name with a dash", { environment: [env("A-B")] }, "environment[0].name: must match"],
  ["name twice", { environment: [env("A"), env("A")] }, 'environment[1]: variable "A" is given twice'],
  // size
  ...(["s", "m", "l", "xl"] as const).map((size): Row => [`size ${size}`, { size }, null]),
  ["size xxl", { size: "xxl" }, "size: must be one of s, m, l, xl"],
  // timeout_minutes
  ["timeout 1 minute", { timeout_minutes: 1 }, null],
  ["timeout 1440 minutes", { timeout_minutes: 1440 }, null],
  ["timeout 0 minutes", { timeout_minutes: 0 }, "timeout_minutes: must be an integer from 1 to 1440"],
  ["timeout 1441 minutes", { timeout_minutes: 1441 }, "timeout_minutes: must be an integer from 1 to 1440"],
  ["timeout 2.5 minutes", { timeout_minutes: 2.5 }, "timeout_minutes: must be an integer from 1 to 1440"],
  ["timeout as a string", { timeout_minutes: "30" }, "timeout_minutes: must be a number"],
  // base
  ["a base name", { base: "debian-bookworm-20260101-0123456789ab" }, null],
  ["a base without date and hash", { base: "debian-bookworm" }, "base: must be a base name"],
  // provider
  ...[`${id("prv")}@3`, `${id("prv")}@latest`, "claude", "claude@latest", "claude@12", "none"].map(
    (provider): Row => [`provider ${provider}`, { provider }, null],
  ),
  ...[id("prv"), `${id("prv")}@0`, "claude@", "claude@v2", "Claude", `${id("prv")}@latest@1`].map(
    (provider): Row => [`provider ${provider}`, { provider }, "provider: must be prv_<id>@<n>"],
  ),
  // unknown fields
  ["an unknown field", { timeout_minute: 30 }, "timeout_minute: unknown field"],
]

describe("CreateFunctionRequest", () => {
  it.each(rows)("%s", (_label, patch, expected) => {
    const message = failure(withPatch(minimal, patch))
    if (expected === null) expect(message).toBeUndefined()
    else expect(message).toMatch(new RegExp(`^${expected.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`))
  })

  it("fills every default of a minimal body", () => {
    expect(decoded(minimal)).toEqual({
      name: "fn",
      system_prompt: "do it",
      setup: [],
      tools: ["bash", "read", "write", "edit", "screenshot", "web_search"],
      custom_tools: [],
      input_manifest: [],
      output_manifest: [{ path: "report.md", max_bytes: outputMaxBytes }],
      environment: [],
      size: "m",
      timeout_minutes: 30,
    })
  })

  it("leaves base and provider open for publishing to fill", () => {
    const d = decoded(minimal)
    expect(d.base).toBeUndefined()
    expect(d.provider).toBeUndefined()
  })

  it("fills manifest max_bytes with 5 GB for inputs and 50 GiB for outputs", () => {
    const d = decoded({ ...minimal, input_manifest: [entry("in.csv")], output_manifest: [entry("out/")] })
    expect(d.input_manifest[0]!.max_bytes).toBe(inputMaxBytesDefault)
    expect(inputMaxBytesDefault).toBe(5_000_000_000)
    expect(d.output_manifest[0]!.max_bytes).toBe(50 * 1024 ** 3)
  })

  it("fills a custom tool's timeout with 30 seconds", () => {
    expect(decoded({ ...minimal, custom_tools: [tool()] }).custom_tools[0]!.timeout_seconds).toBe(30)
  })

  it("never quotes a refused secret in the message", () => {
    const secret = `${"s".repeat(4097)}`
    const message = failure({ ...minimal, environment: [env("A", { secret })] })
    expect(message).toBeDefined()
    expect(message).not.toContain("sss")
  })

  it("refuses a body that is not an object", () => {
    expect(failure([minimal])).toBe("body: must be an object")
    expect(failure(null)).toBe("body: must be an object")
  })
})

describe("PublishVersionRequest", () => {
  it("takes a Definition without a name and fills the same defaults", () => {
    const r = decodeBodyEither(PublishVersionRequest)({ system_prompt: "p", output_manifest: [entry("a")] })
    expect(Either.isRight(r) && r.right.timeout_minutes).toBe(30)
  })

  it("refuses a name (it belongs to the function)", () => {
    const r = decodeBodyEither(PublishVersionRequest)({ ...minimal })
    expect(Either.isLeft(r) && r.left.message).toBe("name: unknown field")
  })
})

describe("openObjectAt", () => {
  it.each([
    ["$defs", { ...closed, $defs: { x: { type: "object" } } }, ["$defs", "x"]],
    [
      "type list with object",
      { ...closed, properties: { a: { type: ["object", "null"] } } },
      ["properties", "a"],
    ],
    [
      "patternProperties",
      { ...closed, patternProperties: { "^x": { properties: {} } } },
      ["patternProperties", "^x"],
    ],
    ["allOf", { ...closed, allOf: [closed, { type: "object", additionalProperties: true }] }, ["allOf", 1]],
    ["closed", { ...closed, properties: { a: closed } }, undefined],
  ] as const)("finds an open object in %s", (_label, schema, path) => {
    expect(openObjectAt(schema)).toEqual(path)
  })
})
