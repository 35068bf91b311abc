/**
 * Runs end to end through HTTP on the whole stack (`test/harness/Stack.ts`: nats-server, actor
 * worker, host agent with the namespace driver, gateway): publish → upload input → start → every
 * machine command → finish → the output archive; each failure cause produced for real; billing in
 * `GET /v1/usage`. A billed minute is `MINUTE_MS` here, so timeouts and billing take seconds. The
 * slow cases (20 runs, restarts, webhooks, queue timeout) are in `runs.heavy.test.ts`.
 */
import { spawnSync } from "node:child_process"
import { createHash, randomBytes } from "node:crypto"
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { minutePriceUsdNanos, sizes } from "../schema/Limits.ts"
import {
  balance,
  call,
  closeStack,
  command,
  createAccount,
  credit,
  expectStatus,
  getRun,
  type Json,
  publish,
  request,
  runLog,
  type Stack,
  sendCommandAnswer,
  setAccountState,
  startRun,
  startStack,
  type TestAccount,
  tar,
  tarGz,
  upload,
  waitCommand,
  waitCommandRunning,
  waitRun,
} from "./harness/Stack.ts"

const MINUTE_MS = 1_000
const sha256 = (data: Uint8Array) => createHash("sha256").update(data).digest("hex")

let stack: Stack
let acct: TestAccount

beforeAll(async () => {
  stack = await startStack({
    minuteMs: MINUTE_MS,
    queueTimeoutMs: 120_000,
    logFlushMs: 500,
    settings: { RUN_FINISH_WAIT_MS: 2_000 },
  })
  acct = await createAccount(stack, { creditUsd: 100 })
}, 120_000)

afterAll(() => closeStack(stack), 120_000)

/** Lines of the stack's logs at warning or above (shown when a test fails). */
const problems = () =>
  stack.lines
    .filter((l) => /"level":"(warn|warning|error|fatal)"/i.test(l.line))
    .map((l) => `${l.role} ${l.line}`)
    .slice(-40)
    .join("\n")

/** Extracts a `.tar.gz` into a fresh folder; answers every file (path → bytes) in it. */
const unpack = async (archive: Uint8Array): Promise<Map<string, Buffer>> => {
  const dir = await mkdtemp(join(tmpdir(), "hangar-runs-out-"))
  try {
    const file = join(dir, "archive.tar.gz")
    await writeFile(file, archive)
    const into = join(dir, "x")
    await mkdir(into)
    const r = spawnSync("tar", ["-xzf", file, "-C", into])
    if (r.status !== 0) throw new Error(`tar: ${r.stderr.toString()}`)
    const files = new Map<string, Buffer>()
    const walk = async (rel: string) => {
      for (const name of await readdir(join(into, rel))) {
        const path = rel === "" ? name : `${rel}/${name}`
        if ((await stat(join(into, path))).isDirectory()) await walk(path)
        else files.set(path, await readFile(join(into, path)))
      }
    }
    await walk("")
    return files
  } finally {
    await rm(dir, { recursive: true, force: true })
  }
}

const failedWith = async (run: string, failure: string, timeoutMs = 60_000): Promise<Json> => {
  const ended = await waitRun(stack, acct, run, { timeoutMs })
  expect(ended.state, `${JSON.stringify(ended)}\n${problems()}`).toBe("failed")
  expect(ended.failure, JSON.stringify(ended)).toBe(failure)
  expect(ended.ended_at).toBeDefined()
  expect(ended.output).toBeUndefined()
  return ended
}

describe("a run from publish to output", () => {
  it("publish → upload → start → bash, write, read, edit, list, put, get → finish → the output archive", async () => {
    const fn = await publish(stack, acct, {
      input_manifest: [{ path: "data.txt" }, { path: "docs/" }],
      output_manifest: [{ path: "result.txt" }, { path: "put.bin" }],
      setup: ["echo setup-ran > /workspace/setup.txt"],
      timeout_minutes: 600,
    })
    const input = tarGz([
      { path: "data.txt", content: "hello input\n" },
      { path: "docs", dir: true },
      { path: "docs/a.md", content: "# A\n" },
    ])
    const inputId = await upload(stack, acct, input)
    const started = await startRun(stack, acct, fn.function, {
      input: inputId,
      external_reference: "ticket-7",
    })
    expect(started).toMatchObject({
      state: "queued",
      function: fn.function,
      version: 1,
      size: "s",
      provider: "none",
      input: inputId,
      external_reference: "ticket-7",
    })
    const run = started.id as string

    // Sent while the run may still be queued: it starts once the machine is ready.
    const bash = await command(stack, acct, run, "bash", {
      command: "cat /workspace/in/data.txt /workspace/in/docs/a.md /workspace/setup.txt; pwd",
    })
    expect(bash, JSON.stringify(bash)).toMatchObject({
      kind: "bash",
      state: "succeeded",
      source: "caller",
      sequence: 1,
      result: { exit_code: 0, timed_out: false, truncated: false, oom_killed: false },
    })
    expect(bash.result.output).toBe("hello input\n# A\nsetup-ran\n/workspace\n")
    expect((await getRun(stack, acct, run)).state).toBe("running")

    // Finishing before the output is there: problems come back and the run goes on.
    const early = await command(stack, acct, run, "finish", { state: "succeeded" })
    expect(early.state).toBe("succeeded")
    expect(early.result.accepted).toBe(false)
    expect(early.result.problems.join("\n")).toContain("result.txt")
    expect((await getRun(stack, acct, run)).state).toBe("running")

    const write = await command(stack, acct, run, "write", {
      file_path: "out/result.txt",
      content: "draft one\nline two\n",
    })
    expect(write.result).toEqual({ bytes: 19 })
    const read = await command(stack, acct, run, "read", { file_path: "/workspace/out/result.txt" })
    expect(read.state).toBe("succeeded")
    expect(read.result.output).toContain("draft one")
    expect(read.result.output).toContain("line two")
    const edit = await command(stack, acct, run, "edit", {
      file_path: "out/result.txt",
      edits: [{ old_text: "draft one", new_text: "final answer" }],
    })
    expect(edit.result).toEqual({ applied: 1 })

    const blob = randomBytes(100_000)
    const blobId = await upload(stack, acct, blob)
    const put = await command(stack, acct, run, "put", { file: blobId, path: "out/put.bin" })
    expect(put.result).toEqual({ bytes: 100_000 })

    const list = await command(stack, acct, run, "list", { path: "out" })
    expect(list.result.truncated).toBe(false)
    expect(list.result.entries).toEqual(
      expect.arrayContaining([
        { name: "result.txt", type: "file", size: 22 },
        { name: "put.bin", type: "file", size: 100_000 },
      ]),
    )

    const got = await command(stack, acct, run, "get", { path: "out/result.txt" })
    expect(got.state).toBe("succeeded")
    const file = await request(got.result.download_url)
    expect(file.status).toBe(200)
    expect(file.data.toString("utf8")).toBe("final answer\nline two\n")
    const folder = await command(stack, acct, run, "get", { path: "in" })
    const folderArchive = await request(folder.result.download_url)
    expect(folderArchive.status).toBe(200)
    const inFiles = await unpack(folderArchive.data)
    const inNames = [...inFiles.keys()].map((p) => p.replace(/^(\.\/)?(in\/)?/, ""))
    expect(inNames.sort()).toEqual(["data.txt", "docs/a.md"])

    const finish = await command(stack, acct, run, "finish", { state: "succeeded", detail: "all done" })
    expect(finish.result.accepted, JSON.stringify(finish)).toBe(true)
    const ended = await waitRun(stack, acct, run)
    expect(ended.state, `${JSON.stringify(ended)}\n${problems()}`).toBe("succeeded")
    expect(ended.started_at).toBeDefined()
    expect(ended.ended_at).toBeDefined()
    expect(ended.failure).toBeUndefined()
    expect(ended.output).toMatchObject({ file_count: 2 })
    expect(ended.output.files).toEqual(
      expect.arrayContaining([
        { path: "result.txt", bytes: 22, dir: false },
        { path: "put.bin", bytes: 100_000, dir: false },
      ]),
    )

    const archive = await request(ended.output.url)
    expect(archive.status).toBe(200)
    expect(archive.data.byteLength).toBe(ended.output.bytes)
    expect(sha256(archive.data)).toBe(ended.output.sha256)
    const outFiles = await unpack(archive.data)
    const byName = new Map([...outFiles].map(([p, d]) => [p.replace(/^(\.\/)?(out\/)?/, ""), d]))
    expect([...byName.keys()].sort()).toEqual(["put.bin", "result.txt"])
    expect(byName.get("result.txt")!.toString("utf8")).toBe("final answer\nline two\n")
    expect(sha256(byName.get("put.bin")!)).toBe(sha256(blob))

    // Every command, in order, as the caller sent them.
    const listed = await call(stack, "GET", `/v1/runs/${run}/commands?since=0`, acct.admin)
    expect(listed.status).toBe(200)
    expect(listed.body.state).toBe("succeeded")
    expect(listed.body.commands.map((c: Json) => [c.sequence, c.kind, c.state])).toEqual([
      [1, "bash", "succeeded"],
      [2, "finish", "succeeded"],
      [3, "write", "succeeded"],
      [4, "read", "succeeded"],
      [5, "edit", "succeeded"],
      [6, "put", "succeeded"],
      [7, "list", "succeeded"],
      [8, "get", "succeeded"],
      [9, "get", "succeeded"],
      [10, "finish", "succeeded"],
    ])

    // Nothing more changes on an ended run: a long poll from its end answers at once with its
    // state, not after its wait (the request gives up long before the 25 s it asks for).
    const polled = await fetch(`${stack.url}/v1/runs/${run}/commands?since=${listed.body.sequence}&wait=25`, {
      headers: acct.admin,
      signal: AbortSignal.timeout(15_000),
    })
    expect(await polled.json()).toEqual({ commands: [], state: "succeeded", sequence: listed.body.sequence })

    // An ended run refuses commands.
    const late = await call(stack, "POST", `/v1/runs/${run}/commands`, acct.admin, {
      kind: "bash",
      arguments: { command: "true" },
    })
    expect(late.status).toBe(409)
    expect(late.body.code).toBe("run_ended")

    // The log names the setup command.
    const setup = (await runLog(stack, acct, run)).filter((l) => l.kind === "setup")
    expect(JSON.stringify(setup)).toContain("echo setup-ran")
  }, 180_000)

  it("a finish sent with the work waits for the earlier commands to end before judging the output", async () => {
    const fn = await publish(stack, acct)
    const run = (await startRun(stack, acct, fn.function)).id
    // Sent back to back while the run is queued: finish starts as soon as the bash has started.
    const work = expectStatus(
      await sendCommandAnswer(stack, acct, run, "bash", {
        command: "sleep 1 && mkdir -p out && echo late > out/result.txt",
      }),
      201,
      "bash",
    )
    const finish = expectStatus(
      await sendCommandAnswer(stack, acct, run, "finish", { state: "succeeded" }),
      201,
      "finish",
    )
    const ended = await waitRun(stack, acct, run)
    expect(ended.state).toBe("succeeded")
    const bash = await waitCommand(stack, acct, run, work.id)
    const done = await waitCommand(stack, acct, run, finish.id)
    expect(done.result).toEqual({ accepted: true })
    expect(Date.parse(done.ended_at)).toBeGreaterThanOrEqual(Date.parse(bash.ended_at))
    const archive = await request(ended.output.url)
    expect(spawnSync("tar", ["-xzO", "-f", "-"], { input: archive.data }).stdout.toString()).toBe("late\n")
  }, 120_000)

  it("a long command does not hold a finish: the run ends within the finish wait and the command is cancelled", async () => {
    const fn = await publish(stack, acct)
    const run = (await startRun(stack, acct, fn.function)).id
    const written = await command(stack, acct, run, "write", {
      file_path: "out/result.txt",
      content: "done\n",
    })
    expect(written.state).toBe("succeeded")
    const long = expectStatus(
      await sendCommandAnswer(stack, acct, run, "bash", { command: "echo started; sleep 600; echo never" }),
      201,
      "bash",
    )
    await waitCommandRunning(stack, acct, run, long.id)
    const finish = expectStatus(
      await sendCommandAnswer(stack, acct, run, "finish", { state: "succeeded" }),
      201,
      "finish",
    )
    // The finish is judged after the wait (2 s here), not after the sleep's 600 s (the test's
    // own time-out is shorter than that).
    const ended = await waitRun(stack, acct, run, { timeoutMs: 60_000 })
    expect(ended.state, JSON.stringify(ended)).toBe("succeeded")
    expect((await waitCommand(stack, acct, run, finish.id)).result).toEqual({ accepted: true })
    const sleeper = await waitCommand(stack, acct, run, long.id)
    expect(sleeper.state, JSON.stringify(sleeper)).toBe("cancelled")
  }, 120_000)

  it("an agentless run has an empty /workspace/out (and /workspace/in) from its first command, input or not", async () => {
    const fn = await publish(stack, acct, { output_manifest: [{ path: "result.txt" }] })
    const withInput = await startRun(stack, acct, fn.function, {
      input: await upload(stack, acct, tarGz([{ path: "data.txt", content: "hello\n" }])),
    })
    // The caller's first command writes straight into /workspace/out: no mkdir needed.
    const first = await command(stack, acct, withInput.id, "bash", {
      command:
        "ls -A /workspace/out | wc -l; tr a-z A-Z < /workspace/in/data.txt > /workspace/out/result.txt",
    })
    expect(first, JSON.stringify(first)).toMatchObject({
      state: "succeeded",
      result: { exit_code: 0, output: "0\n" },
    })
    const finished = await command(stack, acct, withInput.id, "finish", { state: "succeeded" })
    expect(finished.state, JSON.stringify(finished)).toBe("succeeded")
    expect((await waitRun(stack, acct, withInput.id)).state).toBe("succeeded")

    const without = await startRun(stack, acct, fn.function)
    const listed = await command(stack, acct, without.id, "list", { path: "/workspace/out" })
    expect(listed, JSON.stringify(listed)).toMatchObject({ state: "succeeded", result: { entries: [] } })
    const inListed = await command(stack, acct, without.id, "list", { path: "/workspace/in" })
    expect(inListed, JSON.stringify(inListed)).toMatchObject({ state: "succeeded", result: { entries: [] } })
    await command(stack, acct, without.id, "finish", { state: "failed", detail: "done looking" })
  })

  it("GET /v1/functions shows each function's newest run, as GET /v1/runs/{id} does", async () => {
    const fn = await publish(stack, acct, { name: "with-last" })
    const other = await publish(stack, acct, { name: "never-run" })
    const listed = async () => {
      const list = expectStatus(await call(stack, "GET", "/v1/functions", acct.admin), 200, "functions")
      return new Map<string, Json>(list.functions.map((f: Json) => [f.id, f]))
    }
    expect((await listed()).get(fn.function)?.last).toBeUndefined()
    const first = (await startRun(stack, acct, fn.function)).id
    await command(stack, acct, first, "finish", { state: "failed" })
    await waitRun(stack, acct, first)
    const second = (await startRun(stack, acct, fn.function)).id
    await command(stack, acct, second, "bash", { command: "mkdir -p out && echo 2 > out/result.txt" })
    await command(stack, acct, second, "finish", { state: "succeeded" })
    const ended = await waitRun(stack, acct, second)
    const now = await listed()
    expect(now.get(other.function)?.last).toBeUndefined()
    const last = now.get(fn.function)?.last
    expect({ ...last, output: { ...last.output, url: undefined } }).toEqual({
      ...ended,
      output: { ...ended.output, url: undefined },
    })
    // Its output link works like the run's own.
    const archive = await request(last.output.url)
    expect(archive.status).toBe(200)
  }, 120_000)

  it("finish as failed fails the run with no_submission and the detail", async () => {
    const fn = await publish(stack, acct)
    const run = (await startRun(stack, acct, fn.function)).id
    const finish = await command(stack, acct, run, "finish", { state: "failed", detail: "gave up" })
    expect(finish.state).toBe("succeeded")
    const ended = await failedWith(run, "no_submission")
    expect(ended.detail).toContain("gave up")
  }, 120_000)
})

describe("the log of an ended run", () => {
  it("read the moment the run is seen ended, ends with its machine's end line, each time", async () => {
    // The last part is stored as the machine goes, just after the run ends: the route waits for it.
    const fn = await publish(stack, acct, { timeout_minutes: 60 })
    for (let i = 0; i < 3; i++) {
      const run = (await startRun(stack, acct, fn.function)).id
      expect((await command(stack, acct, run, "finish", { state: "failed" })).state).toBe("succeeded")
      const deadline = Date.now() + 60_000
      while ((await getRun(stack, acct, run)).state !== "failed" && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 5))
      const kinds = (await runLog(stack, acct, run)).map((l) => l.kind)
      expect(kinds.at(-1), `${kinds.join(" ")}\n${problems()}`).toBe("end")
      expect(kinds).toContain("finish")
    }
  }, 120_000)
})

describe("each failure cause, produced for real", () => {
  const withInput = async (archive: Uint8Array, manifest: ReadonlyArray<Json> = [{ path: "data.txt" }]) => {
    const fn = await publish(stack, acct, { input_manifest: manifest })
    const input = await upload(stack, acct, archive)
    return (await startRun(stack, acct, fn.function, { input })).id as string
  }

  it("input: not a gzip tar (a plain tar, and random bytes)", async () => {
    const plain = await withInput(tar([{ path: "data.txt", content: "x" }]))
    const junk = await withInput(randomBytes(4096))
    const a = await failedWith(plain, "input")
    const b = await failedWith(junk, "input")
    expect(a.started_at).toBeDefined()
    expect(b.detail).toBeTruthy()
  }, 120_000)

  it("input: a link in the archive", async () => {
    const run = await withInput(
      tarGz([
        { path: "data.txt", content: "x" },
        { path: "evil", symlink: "/etc/passwd" },
      ]),
    )
    const ended = await failedWith(run, "input")
    expect(ended.detail).toContain("evil")
  }, 120_000)

  it("input: the input manifest names a file the archive misses", async () => {
    const run = await withInput(tarGz([{ path: "other.txt", content: "x" }]), [{ path: "data.txt" }])
    const ended = await failedWith(run, "input")
    expect(ended.detail).toContain("data.txt")
  }, 120_000)

  it("setup: a command exits 1; its output is in the detail", async () => {
    const fn = await publish(stack, acct, {
      setup: ["echo first-ok", "echo setup-broke-here >&2; exit 1", "echo never"],
    })
    const run = (await startRun(stack, acct, fn.function)).id
    // A command sent meanwhile never runs: it ends cancelled with the run.
    const sent = await call(stack, "POST", `/v1/runs/${run}/commands`, acct.admin, {
      kind: "bash",
      arguments: { command: "true" },
    })
    expect(sent.status).toBe(201)
    const ended = await failedWith(run, "setup")
    expect(ended.detail).toContain("setup-broke-here")
    const cmd = await waitCommand(stack, acct, run, sent.body.id)
    expect(cmd.state).toBe("cancelled")
  }, 120_000)

  it("timeout: a 1-minute function fails with timeout after its minute, billed one minute", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 1 })
    const run = (await startRun(stack, acct, fn.function)).id
    const sleeping = await call(stack, "POST", `/v1/runs/${run}/commands`, acct.admin, {
      kind: "bash",
      arguments: { command: "sleep 600" },
    })
    expect(sleeping.status).toBe(201)
    const ended = await failedWith(run, "timeout")
    const ms = Date.parse(ended.ended_at) - Date.parse(ended.started_at)
    expect(ms).toBeGreaterThanOrEqual(MINUTE_MS)
    const cmd = await waitCommand(stack, acct, run, sleeping.body.id)
    expect(cmd.state).toBe("cancelled")
    const entries = await computeEntries(run)
    expect(entries.map((e: Json) => [e.from_minute, e.through_minute])).toEqual([[1, 1]])
  }, 120_000)

  it("credit: a balance just above the minimum, running minutes push it past −$10: failed credit", async () => {
    const poor = await createAccount(stack, { creditUsd: 0.01 })
    const fn = await publish(stack, poor, { timeout_minutes: 600 })
    const run = (await startRun(stack, poor, fn.function)).id
    await waitRun(stack, poor, run, { until: (r) => r.state !== "queued" })
    // A debit (a dispute, say) leaves the balance a few minutes above the overdraft line.
    const { balance_usd_nanos } = await balance(stack, poor.id)
    await credit(stack, poor.id, -(balance_usd_nanos + 9_985_000_000) / 1e9)
    const ended = await waitRun(stack, poor, run, { timeoutMs: 60_000 })
    expect(ended.state, `${JSON.stringify(ended)}\n${problems()}`).toBe("failed")
    expect(ended.failure).toBe("credit")
    const after = await balance(stack, poor.id)
    expect(after.balance_usd_nanos).toBeLessThan(-10_000_000_000)
    // The run was billed for the minutes it used, and a new start is refused.
    const refused = await call(stack, "POST", `/v1/functions/${fn.function}/runs`, poor.admin, {
      prompt: "x",
    })
    expect(refused.status).toBe(402)
    expect(refused.body.code).toBe("no_credit")
  }, 120_000)

  it("suspended: suspending the account through the admin path stops its running run", async () => {
    const other = await createAccount(stack, { creditUsd: 10 })
    const fn = await publish(stack, other, { timeout_minutes: 600 })
    const run = (await startRun(stack, other, fn.function)).id
    await waitRun(stack, other, run, { until: (r) => r.state === "running" })
    await setAccountState(stack, other.id, "suspended")
    const ended = await waitRun(stack, other, run, { timeoutMs: 60_000 })
    expect(ended.state, `${JSON.stringify(ended)}\n${problems()}`).toBe("failed")
    expect(ended.failure).toBe("suspended")
    const refused = await call(stack, "POST", `/v1/functions/${fn.function}/runs`, other.admin, {
      prompt: "x",
    })
    expect(refused.status).toBe(403)
    expect(refused.body.code).toBe("suspended")
  }, 120_000)
})

/** The run's `compute` ledger entries in `GET /v1/usage` (owner), oldest first. */
const computeEntries = async (run: string, who: TestAccount = acct): Promise<Array<Json>> => {
  const usage = await call(stack, "GET", "/v1/usage", who.owner)
  expect(usage.status).toBe(200)
  return usage.body.entries
    .filter((e: Json) => e.kind === "compute" && e.run === run)
    .sort((a: Json, b: Json) => a.from_minute - b.from_minute)
}

describe("billing", () => {
  it("a run's compute entries cover minutes 1..n once each and sum to n × the minute price", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 600 })
    const run = (await startRun(stack, acct, fn.function, { external_reference: "bill-1" })).id
    await command(stack, acct, run, "bash", { command: "sleep 3.5" })
    await command(stack, acct, run, "write", { file_path: "out/result.txt", content: "ok" })
    await command(stack, acct, run, "finish", { state: "succeeded" })
    const ended = await waitRun(stack, acct, run)
    expect(ended.state).toBe("succeeded")
    const minutes = Math.max(
      1,
      Math.ceil((Date.parse(ended.ended_at) - Date.parse(ended.started_at)) / MINUTE_MS),
    )
    const price = minutePriceUsdNanos(sizes.s.memoryMib)
    const entries = await computeEntries(run)
    expect(entries.length).toBeGreaterThan(0)
    let next = 1
    for (const e of entries) {
      expect(e.from_minute).toBe(next)
      expect(e.amount_usd_nanos).toBe(-(e.through_minute - e.from_minute + 1) * price)
      expect(e).toMatchObject({
        run,
        function: fn.function,
        version: 1,
        size: "s",
        provider: "none",
        external_reference: "bill-1",
        memory_mib: sizes.s.memoryMib,
        rate_usd_nanos_per_gib_hour: 150_000_000,
      })
      expect(e.started_by).toBeTruthy()
      next = e.through_minute + 1
    }
    expect(next - 1).toBe(minutes)
    const total = entries.reduce((sum: number, e: Json) => sum + e.amount_usd_nanos, 0)
    expect(total).toBe(-minutes * price)
    expect(ended.usage.compute.size).toBe("s")
  }, 120_000)
})
