import { mkdtemp, rm } from "node:fs/promises"
import { createServer, type Server } from "node:https"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { rootCertificates } from "node:tls"
import { Effect, Redacted } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CustomTool } from "../../schema/Definition.ts"
import type { SecretId } from "../../schema/Ids.ts"
import { selfSigned } from "../../test/harness/Tls.ts"
import * as CustomTools from "./CustomTools.ts"

const SECRET = "tool-secret-abcdef"
let dir: string
let server: Server
let base: string
let ca: ReadonlyArray<string>
const seen: Array<{ path: string; headers: Record<string, unknown>; body: string }> = []

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-tools-"))
  const tls = await selfSigned(dir)
  const cert = tls.cert
  ca = [...rootCertificates, cert.toString("utf8")]
  server = createServer({ key: tls.key, cert }, (req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      seen.push({ path: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks).toString("utf8") })
      if (req.url === "/ok") res.writeHead(200).end('{"answer":42}')
      else if (req.url === "/big") res.writeHead(200).end("x".repeat(10_000))
      else if (req.url === "/echo") res.writeHead(403).end(`refused ${String(req.headers.authorization)}`)
      else if (req.url === "/redirect") res.writeHead(302, { location: "https://example.com/" }).end()
    })
  })
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
  const address = server.address()
  base = `https://127.0.0.1:${typeof address === "object" && address !== null ? address.port : 0}`
})

afterAll(async () => {
  server?.closeAllConnections()
  await new Promise<void>((ok) => (server ? server.close(() => ok()) : ok()))
  if (dir) await rm(dir, { recursive: true, force: true })
})

const tool = (path: string, over: Partial<CustomTool> = {}): CustomTool => ({
  name: "t",
  description: "a tool",
  parameters: {
    type: "object",
    properties: { n: { type: "integer" } },
    required: ["n"],
    additionalProperties: false,
  },
  url: `${base}${path}`,
  secret_id: "sec_0000000000000000000000000a" as SecretId,
  timeout_seconds: 1,
  ...over,
})

const callTool = (t: CustomTool, options: { allowPrivate?: boolean; maxBytes?: number } = {}) =>
  Effect.runPromise(
    CustomTools.call({
      tool: t,
      secret: Redacted.make(SECRET),
      run: "run_0000000000000000000000000a",
      args: { n: 1 },
      allowPrivate: options.allowPrivate ?? true,
      maxBytes: options.maxBytes ?? 1024,
      ca,
    }),
  )

describe("custom tool arguments", () => {
  it("accepts what fits the schema and names what does not", () => {
    const t = tool("/ok")
    expect(CustomTools.checkArguments(t, { n: 1 })).toBeUndefined()
    expect(CustomTools.checkArguments(t, { n: "one" })).toContain("/n")
    expect(CustomTools.checkArguments(t, {})).toContain("n")
    expect(CustomTools.checkArguments(t, { n: 1, extra: true })).toContain("additional")
    expect(CustomTools.checkArguments(t, "{not json")).toBe("the arguments are not a JSON object")
    const broken = tool("/ok", {
      name: "broken",
      parameters: { type: "object", properties: { a: { type: 7 } } },
    })
    expect(CustomTools.checkArguments(broken, {})).toContain("not a usable JSON Schema")
  })
})

describe("custom tool calls", () => {
  it("POST the arguments with the bearer secret and Service-Run; a 2xx answer is the result", async () => {
    expect(await callTool(tool("/ok"))).toEqual({ ok: true, text: '{"answer":42}' })
    const got = seen.at(-1)!
    expect(got.headers.authorization).toBe(`Bearer ${SECRET}`)
    expect(got.headers["service-run"]).toBe("run_0000000000000000000000000a")
    expect(got.headers["content-type"]).toBe("application/json")
    expect(JSON.parse(got.body)).toEqual({ n: 1 })
  })

  it("refuses a loopback address unless allowed, and a URL that is not https, without calling", async () => {
    const before = seen.length
    const refused = await callTool(tool("/ok"), { allowPrivate: false })
    expect(refused.ok).toBe(false)
    expect(!refused.ok && refused.error).toContain("not a public address")
    const plain = await callTool(tool("/ok", { url: base.replace("https:", "http:") }))
    expect(!plain.ok && plain.error).toContain("not https")
    expect(seen.length).toBe(before)
  })

  it("an error status, a redirect, a too large answer and no answer in time are errors without the secret", async () => {
    const echo = await callTool(tool("/echo"))
    expect(!echo.ok && echo.error).toContain("HTTP 403")
    expect(!echo.ok && echo.error).not.toContain(SECRET)
    const redirect = await callTool(tool("/redirect"))
    expect(!redirect.ok && redirect.error).toContain("HTTP 302")
    const big = await callTool(tool("/big"))
    expect(!big.ok && big.error).toContain("larger than 1024 bytes")
    const slow = await callTool(tool("/slow"))
    expect(!slow.ok && slow.error).toContain("no answer within 1 seconds")
  })

  it("a certificate nobody trusts is an error", async () => {
    const r = await Effect.runPromise(
      CustomTools.call({
        tool: tool("/ok"),
        secret: Redacted.make(SECRET),
        run: "run_0000000000000000000000000a",
        args: { n: 1 },
        allowPrivate: true,
        maxBytes: 1024,
        ca: undefined,
      }),
    )
    expect(r.ok).toBe(false)
    expect(!r.ok && r.error).toContain("the tool call failed")
  })
})
