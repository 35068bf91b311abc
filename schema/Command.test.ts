import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { CommandRecord, CreateCommandRequest, ListCommandsQuery } from "./Command.ts"
import { decodeBodyEither } from "./Decode.ts"
import { refusal } from "./testing.ts"

const refused = refusal(CreateCommandRequest)
const key = Buffer.concat([Buffer.from([4]), Buffer.alloc(64, 7)]).toString("base64url")
const cmd = (kind: string, args: unknown) => ({ kind, arguments: args })
// The JSON of `{"file_path":"a","content":"..."}` is 30 bytes plus the content.
const argumentsOf = (bytes: number) => ({ file_path: "a", content: "x".repeat(bytes - 30) })

describe("CreateCommandRequest", () => {
  it.each([
    ["bash", cmd("bash", { command: "ls -la", workdir: "in", env: { A_1: "x" } }), null],
    ["bash timeout 24 hours", cmd("bash", { command: "ls", timeout_ms: 86_400_000 }), null],
    [
      "bash timeout 24 hours + 1 ms",
      cmd("bash", { command: "ls", timeout_ms: 86_400_001 }),
      "arguments.timeout_ms: must be an integer from 1 to 86400000",
    ],
    [
      "bash timeout 0",
      cmd("bash", { command: "ls", timeout_ms: 0 }),
      "arguments.timeout_ms: must be an integer from 1",
    ],
    ["bash without command", cmd("bash", {}), "arguments.command: is required"],
    [
      "bash env name with a dash",
      cmd("bash", { command: "ls", env: { "A-B": "x" } }),
      "arguments.env.A-B: must match",
    ],
    ["bash unknown argument", cmd("bash", { command: "ls", cwd: "/" }), "arguments.cwd: unknown field"],
    ["read", cmd("read", { file_path: "a", offset: 1, limit: 10 }), null],
    [
      "read offset 0",
      cmd("read", { file_path: "a", offset: 0 }),
      "arguments.offset: must be an integer of at least 1",
    ],
    ["write", cmd("write", { file_path: "a", content: "" }), null],
    ["arguments of 128 KiB of JSON", cmd("write", argumentsOf(131_072)), null],
    [
      "arguments of 128 KiB + 1 of JSON",
      cmd("write", argumentsOf(131_073)),
      "arguments: at most 131072 bytes of JSON",
    ],
    ["edit", cmd("edit", { file_path: "a", edits: [{ old_text: "x", new_text: "" }] }), null],
    [
      "edit with no edits",
      cmd("edit", { file_path: "a", edits: [] }),
      "arguments.edits: at least one edit is required",
    ],
    [
      "edit with empty old_text",
      cmd("edit", { file_path: "a", edits: [{ old_text: "", new_text: "y" }] }),
      "arguments.edits[0].old_text: must not be empty",
    ],
    ["list", cmd("list", { path: "." }), null],
    ["put", cmd("put", { file: `file_${"0".repeat(26)}`, path: "in/x" }), null],
    ["put of a non-upload", cmd("put", { file: "x", path: "in/x" }), "arguments.file: must be a file_ id"],
    ["get", cmd("get", { path: "out/" }), null],
    ["finish", cmd("finish", { state: "failed", detail: "gave up" }), null],
    [
      "finish cancelled",
      cmd("finish", { state: "cancelled" }),
      "arguments.state: must be one of succeeded, failed",
    ],
    ["terminal", cmd("terminal", { rows: 24, cols: 80, public_key: key }), null],
    [
      "terminal rows 0",
      cmd("terminal", { rows: 0, cols: 80, public_key: key }),
      "arguments.rows: must be an integer from 1 to 65535",
    ],
    [
      "terminal compressed key",
      cmd("terminal", { rows: 24, cols: 80, public_key: key.slice(0, 44) }),
      "arguments.public_key: must be an uncompressed P-256 point",
    ],
    ["unknown kind", cmd("python", {}), "kind: must be one of bash, read"],
    ["arguments not an object", cmd("bash", "ls"), "arguments: must be an object"],
  ] as const)("%s", (_label, body, expected) => {
    const message = refused(body)
    if (expected === null) expect(message).toBeUndefined()
    else expect(message?.startsWith(expected) ? expected : message).toBe(expected)
  })

  it("fills the bash timeout with 5 minutes", () => {
    const r = decodeBodyEither(CreateCommandRequest)(cmd("bash", { command: "ls" }))
    if (Either.isLeft(r)) throw new Error(r.left.message)
    const request = r.right
    if (request.kind !== "bash") throw new Error(`decoded as ${request.kind}`)
    expect(request.arguments.timeout_ms).toBe(300_000)
  })
})

describe("CommandRecord", () => {
  it("types the result by kind", () => {
    const record = {
      id: `cmd_${"0".repeat(26)}`,
      run: `run_${"0".repeat(26)}`,
      kind: "bash",
      state: "succeeded",
      source: "caller",
      sequence: 1,
      arguments: { command: "false", timeout_ms: 300_000 },
      result: {
        exit_code: 1,
        output: "",
        output_bytes: 0,
        truncated: false,
        timed_out: false,
        oom_killed: false,
      },
      created_at: "2026-01-01T00:00:00.000Z",
    }
    expect(Schema.is(CommandRecord)(record)).toBe(true)
    const decoded = Schema.decodeUnknownSync(CommandRecord)(record)
    // Narrowing on `kind` types the result (a compile-time check as much as a runtime one).
    expect(decoded.kind === "bash" ? decoded.result?.exit_code : undefined).toBe(1)
    expect(Schema.is(CommandRecord)({ ...record, result: { bytes: 3 } })).toBe(false)
  })
})

describe("query parameters", () => {
  it.each([
    [{ since: "4", wait: "25" }, null],
    [{ wait: "26" }, "wait: must be an integer from 0 to 25"],
    [{ wait: "-1" }, "wait: must be an integer from 0 to 25"],
    [{ since: "x" }, "since: "],
  ] as const)("%o", (query, expected) => {
    const message = refusal(ListCommandsQuery)(query)
    if (expected === null) expect(message).toBeUndefined()
    else expect(message?.startsWith(expected)).toBe(true)
  })
})
