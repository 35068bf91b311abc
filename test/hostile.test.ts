/**
 * Hostile input through the HTTP API on the running stack: paths no machine can take, bodies
 * nested thousands deep, uploads longer than announced, another account's upload ids. Each is
 * refused with the spec's status and a message naming the field, changes nothing, and leaves the
 * run and the service working.
 */
import { createHash, randomBytes } from "node:crypto"
import { readdir, readFile } from "node:fs/promises"
import { connect } from "node:net"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { jsonDepthMax } from "../schema/Decode.ts"
import { filesHolding } from "./harness/files.ts"
import {
  call,
  closeStack,
  command,
  createAccount,
  expectRefused,
  expectStatus,
  leftoversOnceGone,
  machineIdOf,
  publish,
  type Stack,
  sendCommandAnswer,
  startRun,
  startStack,
  type TestAccount,
  upload,
  waitCommand,
  waitCommandRunning,
  waitRun,
} from "./harness/Stack.ts"

let stack: Stack
let acct: TestAccount
let other: TestAccount
let run: string

beforeAll(async () => {
  stack = await startStack()
  acct = await createAccount(stack)
  other = await createAccount(stack)
  const fn = await publish(stack, acct, { timeout_minutes: 60 })
  run = (await startRun(stack, acct, fn.function)).id
  expect((await command(stack, acct, run, "bash", { command: "true" })).state).toBe("succeeded")
}, 120_000)

afterAll(() => closeStack(stack), 120_000)

/** The run's file commands still work. */
const stillWorks = async () => {
  const written = await command(stack, acct, run, "write", { file_path: "probe.txt", content: "ok\n" })
  expect(written.result, JSON.stringify(written)).toEqual({ bytes: 3 })
  const read = await command(stack, acct, run, "read", { file_path: "probe.txt" })
  expect(read.result).toEqual({ output: "ok\n" })
  const edited = await command(stack, acct, run, "edit", {
    file_path: "probe.txt",
    edits: [{ old_text: "ok", new_text: "fine" }],
  })
  expect(edited.result).toEqual({ applied: 1 })
  const listed = await command(stack, acct, run, "list", { path: "." })
  expect(listed.state).toBe("succeeded")
}

describe("paths no Linux path can be", () => {
  const bad: ReadonlyArray<[string, string]> = [
    ["a\u0000b", "NUL"],
    ["\u0000", "only NUL"],
    ["x/\ud800/y", "a lone surrogate"],
    ["\udc00", "a lone low surrogate"],
    [`/workspace/${"a".repeat(256)}`, "a name of 256 bytes"],
    [`/workspace/${"é".repeat(128)}`, "a name of 256 bytes in two-byte characters"],
    [`/${"d/".repeat(2047)}x`, "4,096 bytes"],
  ]
  const fields: ReadonlyArray<[string, string, (path: string) => Record<string, unknown>]> = [
    ["read", "file_path", (p) => ({ file_path: p })],
    ["write", "file_path", (p) => ({ file_path: p, content: "x" })],
    ["edit", "file_path", (p) => ({ file_path: p, edits: [{ old_text: "a", new_text: "b" }] })],
    ["list", "path", (p) => ({ path: p })],
    ["get", "path", (p) => ({ path: p })],
    ["put", "path", (p) => ({ file: `file_${"0".repeat(26)}`, path: p })],
    ["bash", "workdir", (p) => ({ command: "pwd", workdir: p })],
  ]

  it("are refused with 400 naming the field before they reach the machine, in every command kind", async () => {
    const before = await call(stack, "GET", `/v1/runs/${run}/commands`, acct.admin)
    for (const [kind, field, args] of fields) {
      for (const [path, what] of bad) {
        const answer = await sendCommandAnswer(stack, acct, run, kind, args(path))
        expect(answer.status, `${kind} ${field} with ${what}: ${answer.text}`).toBe(400)
        expectRefused(answer, 400, "invalid_request", `arguments.${field}`)
      }
    }
    // NUL in a command or a variable's value is refused too.
    expectRefused(
      await sendCommandAnswer(stack, acct, run, "bash", { command: "echo a\u0000b" }),
      400,
      "invalid_request",
      "arguments.command",
    )
    expectRefused(
      await sendCommandAnswer(stack, acct, run, "bash", { command: "true", env: { X: "a\u0000" } }),
      400,
      "invalid_request",
      "arguments.env.X",
    )
    // Nothing was made, and the run's file commands all still work.
    const after = await call(stack, "GET", `/v1/runs/${run}/commands`, acct.admin)
    expect(after.body.commands.length).toBe(before.body.commands.length)
    await stillWorks()
  })

  it("at the limits, and with control characters, are passed on as they are", async () => {
    const longName = `/workspace/${"n".repeat(255)}`
    const written = await command(stack, acct, run, "write", { file_path: longName, content: "255\n" })
    expect(written.result, JSON.stringify(written)).toEqual({ bytes: 4 })
    expect((await command(stack, acct, run, "read", { file_path: longName })).result).toEqual({
      output: "255\n",
    })
    // A path of exactly 4,095 bytes passes the API; the machine answers what Linux says of it.
    const deep = `/${"d/".repeat(2046)}x`
    expect(Buffer.byteLength(deep)).toBe(4094)
    const answered = await command(stack, acct, run, "read", { file_path: `${deep}y` })
    expect(answered.state).toBe("succeeded")
    expect(answered.result.error).toBeDefined()
    const control = "ctl\u0001\u001f\u007f\t.txt"
    expect((await command(stack, acct, run, "write", { file_path: control, content: "c\n" })).result).toEqual(
      {
        bytes: 2,
      },
    )
    expect((await command(stack, acct, run, "read", { file_path: control })).result).toEqual({
      output: "c\n",
    })
    const listed = await command(stack, acct, run, "list", { path: "." })
    expect(listed.result.entries.map((e: { name: string }) => e.name)).toContain(control)
    await stillWorks()
  })
})

describe("bodies nested deep", () => {
  const nested = (depth: number, open: string, close: string, inner = "1") =>
    `${open.repeat(depth)}${inner}${close.repeat(depth)}`

  it(`are refused with 400 beyond ${jsonDepthMax} levels on every JSON route, before they are parsed`, async () => {
    const targets: ReadonlyArray<[string, string, Record<string, string>, (inner: string) => string]> = [
      ["POST", "/v1/functions", acct.admin, (inner) => `{"name":"deep","system_prompt":${inner}}`],
      ["POST", `/v1/runs/${run}/commands`, acct.admin, (inner) => `{"kind":"bash","arguments":${inner}}`],
      ["POST", "/v1/keys", acct.owner, (inner) => `{"name":${inner},"scope":"admin"}`],
      ["POST", "/v1/files", acct.admin, (inner) => `{"bytes":${inner},"sha256":"x"}`],
    ]
    for (const [method, path, headers, wrap] of targets) {
      for (const [depth, open, close] of [
        [3_000, "[", "]"],
        [2_000, '{"a":', "}"],
        [100_000, "[", "]"],
      ] as const) {
        const body = wrap(nested(depth, open, close))
        const res = await fetch(`${stack.url}${path}`, {
          method,
          headers: { ...headers, "content-type": "application/json" },
          body,
        })
        const answer = (await res.json()) as { code: string; error: string }
        // A body over the route's size limit is refused for its size first (413), as any is.
        if (res.status === 413) {
          expect(answer.code).toBe("payload_too_large")
          expect(Buffer.byteLength(body)).toBeGreaterThan(16 * 1024)
          continue
        }
        expect(res.status, `${path} at ${depth}: ${JSON.stringify(answer)}`).toBe(400)
        expect(answer).toEqual({ code: "invalid_request", error: expect.stringMatching(/^body: .*nest/) })
      }
      // At the limit the body is parsed, and refused (or not) for what it says, never for its depth.
      const atLimit = await fetch(`${stack.url}${path}`, {
        method,
        headers: { ...headers, "content-type": "application/json" },
        body: wrap(nested(jsonDepthMax - 1, "[", "]")),
      })
      expect(atLimit.status).toBeLessThan(500)
      expect(((await atLimit.json()) as { error: string }).error).not.toMatch(/nest/)
      // One level more (the wrapping object counts) is refused for its depth.
      const overLimit = await fetch(`${stack.url}${path}`, {
        method,
        headers: { ...headers, "content-type": "application/json" },
        body: wrap(nested(jsonDepthMax, "[", "]")),
      })
      expect(overLimit.status).toBe(400)
      expect(((await overLimit.json()) as { error: string }).error).toMatch(/^body: .*nest/)
    }
    expect((await fetch(`${stack.url}/v1/health`)).status).toBe(200)
  })
})

describe("uploads", () => {
  /** Sends a raw HTTP request and answers the first response's status line and body. */
  const raw = (url: string, head: string, body: Buffer) =>
    new Promise<{ status: number; text: string }>((ok, fail) => {
      const u = new URL(url)
      const socket = connect({ host: u.hostname, port: Number(u.port) })
      let got = ""
      socket.on("data", (b) => {
        got += b.toString("latin1")
      })
      socket.on("error", fail)
      socket.on("close", () => {
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0)
        ok({ status, text: got })
      })
      socket.write(`${head}\r\n\r\n`)
      socket.write(body)
      setTimeout(() => socket.end(), 1_000)
    })

  it("a PUT whose framing carries more bytes than announced is refused and stores nothing", async () => {
    const data = Buffer.from("0123456789")
    const prefix = data.subarray(0, 6)
    const sha = createHash("sha256").update(prefix).digest("hex")
    const announce = async () =>
      expectStatus(
        await call(stack, "POST", "/v1/files", acct.admin, { bytes: prefix.length, sha256: sha }),
        201,
        "POST /v1/files",
      )
    const head = (url: string) => {
      const u = new URL(url)
      return `PUT ${u.pathname}${u.search} HTTP/1.1\r\nhost: ${u.host}\r\ncontent-type: application/octet-stream\r\nconnection: close`
    }
    for (const framing of ["content-length", "chunked"] as const) {
      const made = await announce()
      const answer =
        framing === "chunked"
          ? await raw(
              made.url,
              `${head(made.url)}\r\ntransfer-encoding: chunked`,
              Buffer.concat([
                Buffer.from(`${data.length.toString(16)}\r\n`),
                data,
                Buffer.from("\r\n0\r\n\r\n"),
              ]),
            )
          : await raw(made.url, `${head(made.url)}\r\ncontent-length: ${data.length}`, data)
      expect(answer.status, `${framing}: ${answer.text}`).toBe(400)
      expect(answer.text).toContain("bytes: ")
      // Nothing stored: the upload is not complete, so a run cannot use it.
      const put = await command(stack, acct, run, "put", { file: made.id, path: "up.bin" })
      expect(put.result, `${framing}: ${JSON.stringify(put)}`).toEqual({
        error: `${made.id}: no such upload`,
      })
    }
    // `content-length` of the announced size followed by more bytes: by HTTP's framing the body
    // is the announced bytes (their SHA-256 checked), and what follows is the start of a next
    // request on the connection, which is not a request and is dropped with the connection. The
    // file stored is exactly what was announced.
    const made = await announce()
    const answer = await raw(made.url, `${head(made.url)}\r\ncontent-length: ${prefix.length}`, data)
    expect(answer.status).toBe(200)
    expect(answer.text.match(/HTTP\/1\.1 /g)).toHaveLength(1)
    const put = await command(stack, acct, run, "put", { file: made.id, path: "exact.bin" })
    expect(put.result).toEqual({ bytes: prefix.length })
    expect((await command(stack, acct, run, "read", { file_path: "exact.bin" })).result).toEqual({
      output: "012345",
    })
  })

  it("another account's upload id is answered as an unknown id is", async () => {
    const theirs = await upload(stack, other, Buffer.from("secret of another account\n"))
    const unknown = `file_${"1".repeat(26)}`
    const answers = []
    for (const file of [theirs, unknown]) {
      const put = await command(stack, acct, run, "put", { file, path: "stolen.txt" })
      expect(put.state, JSON.stringify(put)).toBe("succeeded")
      answers.push(String(put.result.error).replace(file, "<id>"))
    }
    expect(answers[0]).toBe(answers[1])
    expect(answers[0]).toBe("<id>: no such upload")
    const mine = await upload(stack, acct, Buffer.from("mine\n"))
    expect((await command(stack, acct, run, "put", { file: mine, path: "mine.txt" })).result).toEqual({
      bytes: 5,
    })
  })
})

/**
 * Once every sshd process of machine `id` but its first (the listener, its pid namespace's init,
 * which no signal from inside stops) is stopped, as the host sees them; or after 30 s.
 */
const sshdStopped = async (id: string) => {
  const inMachine = new RegExp(`/hangar/${id}(/|$)`, "m")
  const first = (await readFile(join(NamespaceDriverSettings.defaults.machinesDir, id, "pid"), "utf8")).trim()
  const deadline = Date.now() + 30_000
  for (;;) {
    const states: Array<string> = []
    for (const pid of (await readdir("/proc")).filter((p) => /^\d+$/.test(p))) {
      const [cgroup, stat] = await Promise.all([
        readFile(`/proc/${pid}/cgroup`, "utf8"),
        readFile(`/proc/${pid}/stat`, "utf8"),
      ]).catch(() => ["", ""])
      const [, comm, state] = /^\d+ \((.*)\) (\S)/.exec(stat) ?? []
      if (comm === "sshd" && pid !== first && inMachine.test(cgroup)) states.push(state as string)
    }
    if ((states.length > 0 && states.every((st) => st === "T")) || Date.now() > deadline) {
      expect(states.length).toBeGreaterThan(0)
      expect(states.every((st) => st === "T")).toBe(true)
      return
    }
    await new Promise((r) => setTimeout(r, 100))
  }
}

describe("a guest that stops answering", () => {
  it("does not hold its run's end: with every sshd of its machine stopped mid-command, the run ends, the command with it, and the machine goes", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 60 })
    const id = (await startRun(stack, acct, fn.function)).id
    try {
      // Root in its machine may stop any process there, the sshd serving the host agent's
      // connection too: the connection stays up and nothing on it answers any more.
      const sent = expectStatus(
        await sendCommandAnswer(stack, acct, id, "bash", {
          command:
            'for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = sshd ] && kill -STOP "$(basename "$p")"; done; sleep 600',
        }),
        201,
        "POST bash",
      )
      await waitCommandRunning(stack, acct, id, sent.id)
      await sshdStopped(machineIdOf(id))
      // A command with a timeout ends at it, though nothing in the machine answers its kill.
      const timed = await command(stack, acct, id, "bash", { command: "echo never", timeout_ms: 1_000 })
      expect(timed, JSON.stringify(timed)).toMatchObject({
        state: "failed",
        error: expect.stringContaining("timed out after 1000 ms and the machine did not answer its kill"),
      })
      // The finish is the host agent's own work (nothing in the machine answers it): accepted.
      const finished = await command(stack, acct, id, "finish", { state: "failed" })
      expect(finished, JSON.stringify(finished)).toMatchObject({
        state: "succeeded",
        result: { accepted: true },
      })
      expect(await waitRun(stack, acct, id)).toMatchObject({ state: "failed", failure: "no_submission" })
      expect(await waitCommand(stack, acct, id, sent.id)).toMatchObject({ state: "cancelled" })
    } finally {
      // Should an expectation fail midway, the run still ends (its room is the next test's).
      await sendCommandAnswer(stack, acct, id, "finish", { state: "failed" }).catch(() => undefined)
    }
    expect(await leftoversOnceGone(id)).toEqual([])
  }, 120_000)
})

describe("data at rest", () => {
  it("no file of the NATS store holds a run's secret, what it printed, a file it wrote, or its prompt", async () => {
    const tag = randomBytes(8).toString("hex")
    const canaries = {
      secret: `secret-canary-${tag}`,
      prompt: `prompt-canary-${tag}`,
      written: `written-canary-${tag}`,
    }
    const fn = await publish(stack, acct, {
      environment: [{ name: "CANARY", secret: canaries.secret }],
      timeout_minutes: 60,
    })
    const id = (await startRun(stack, acct, fn.function, { prompt: `${canaries.prompt}: print it` })).id
    // What the command prints is the secret and a canary made in the machine (in no argument).
    const printed = await command(stack, acct, id, "bash", {
      command: 'echo "$CANARY"; echo "printed-canary-$(printf %s "$TAG")"; seq 1 20000',
      env: { TAG: tag },
    })
    expect(printed.state).toBe("succeeded")
    const output = await call(stack, "GET", `/v1/runs/${id}/commands/${printed.id}/output`, acct.admin)
    expect(output.body.output.startsWith(`${canaries.secret}\nprinted-canary-${tag}\n1\n`)).toBe(true)
    const write = await command(stack, acct, id, "write", {
      file_path: "/workspace/out/result.txt",
      content: `${canaries.written}\n`,
    })
    expect(write.result).toEqual({ bytes: canaries.written.length + 1 })
    expect(
      (await command(stack, acct, id, "read", { file_path: "/workspace/out/result.txt" })).result,
    ).toEqual({
      output: `${canaries.written}\n`,
    })
    expect((await command(stack, acct, id, "finish", { state: "succeeded" })).state).toBe("succeeded")
    const ended = await waitRun(stack, acct, id)
    expect(ended.state).toBe("succeeded")
    expect(ended.prompt).toBe(`${canaries.prompt}: print it`)

    // The store holds the run: its files grew by far more than the canaries' bytes.
    const held = await filesHolding(stack.natsStoreDir, "")
    expect(held.length).toBeGreaterThan(10)
    for (const [what, text] of Object.entries({ ...canaries, printed: `printed-canary-${tag}` }))
      expect(await filesHolding(stack.natsStoreDir, text), what).toEqual([])
  })
})

describe("random JSON at every route of the OpenAPI document", () => {
  // A small seeded generator, so a failure can be replayed from the printed seed.
  const rng = (seed: number) => () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff
    return seed / 0x7fffffff
  }
  const strings = [
    "",
    "a",
    "\u0000",
    "\ud800",
    "é€𝄞",
    "x".repeat(70_000),
    "../../etc/passwd",
    "fnc_0",
    "<script>",
  ]
  const value = (r: () => number, depth: number): unknown => {
    const pick = Math.floor(r() * (depth > 6 ? 6 : 9))
    switch (pick) {
      case 0:
        return null
      case 1:
        return r() < 0.5
      case 2:
        return [0, -1, 1e308, -1e308, 2 ** 53 + 1, 0.5, 1e-300][Math.floor(r() * 7)]
      case 3:
      case 4:
      case 5:
        return strings[Math.floor(r() * strings.length)]
      case 6:
      case 7:
        return Array.from({ length: Math.floor(r() * 4) }, () => value(r, depth + 1))
      default: {
        const keys = [
          "name",
          "kind",
          "arguments",
          "file_path",
          "command",
          "state",
          "x",
          "__proto__",
          "constructor",
        ]
        return Object.fromEntries(
          Array.from({ length: Math.floor(r() * 4) }, () => [
            keys[Math.floor(r() * keys.length)],
            value(r, depth + 1),
          ]),
        )
      }
    }
  }

  it("answers each with a 4xx and the error body, never a 5xx, and the stack still answers", async () => {
    const doc = (await (await fetch(`${stack.url}/v1/openapi.json`)).json()) as {
      paths: Record<string, Record<string, unknown>>
    }
    const ids: Record<string, string> = { id: run, cid: `cmd_${"0".repeat(26)}` }
    const seed = Date.now() % 100_000
    const r = rng(seed)
    let sent = 0
    for (const [template, methods] of Object.entries(doc.paths)) {
      const path = template.replace(/\{(\w+)\}/g, (_, name: string) => ids[name] ?? `x_${name}`)
      for (const method of Object.keys(methods)) {
        if (!["post", "put", "patch", "delete"].includes(method)) continue
        if (path.startsWith("/v1/uploads/")) continue // signed links: the body is the file (tested above)
        for (let i = 0; i < 12; i++) {
          const body = i === 0 ? "{" : i === 1 ? "[]" : JSON.stringify(value(r, 0))
          for (const headers of [acct.admin, acct.owner]) {
            const res = await fetch(`${stack.url}${path}`, {
              method: method.toUpperCase(),
              headers: { ...headers, "content-type": "application/json" },
              body,
            })
            sent++
            const text = await res.text()
            // The one 5xx the spec names: buying credit with no payment processor configured.
            const spec503 = res.status === 503 && text.includes('"purchases_closed"')
            if (!spec503)
              expect(
                res.status,
                `seed ${seed}: ${method} ${path} ${body.slice(0, 200)} → ${text}`,
              ).toBeLessThan(500)
            if (res.status >= 400)
              expect(JSON.parse(text)).toMatchObject({ code: expect.any(String), error: expect.any(String) })
          }
        }
      }
    }
    expect(sent).toBeGreaterThan(200)
    expect((await fetch(`${stack.url}/v1/health`)).status).toBe(200)
    await stillWorks()
  }, 180_000)
})
