/**
 * Commands through the real stack (gateway, actors, host agent with a namespace machine): a `bash`
 * command's record and its output streamed by long polls while it runs, a create that waits for
 * the command's end, output windows of at most
 * 512 KiB ending on whole characters, the change list, cancelling a running `sleep`, and
 * `run_ended` once `finish` has ended the run.
 *
 * Every wait is a long poll on the API (`wait`), never a sleep: a test that hung would stop at its
 * timeout.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  call,
  createAccount,
  expectStatus,
  type Json,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitCommand,
  waitRun,
} from "../../test/harness/Stack.ts"

let stack: Stack
let a: TestAccount
let run: string

beforeAll(async () => {
  stack = await startStack()
  a = await createAccount(stack)
  const fn = await publish(stack, a)
  run = (await startRun(stack, a, fn.function)).id
}, 180_000)

afterAll(async () => {
  const left = await stack?.close()
  expect(left ?? []).toEqual([])
}, 120_000)

/** Sends a command; with `wait`, the create waits up to that many seconds for its end. */
const send = async (kind: string, args: Record<string, unknown>, wait?: number): Promise<Json> =>
  expectStatus(
    await call(
      stack,
      "POST",
      `/v1/runs/${run}/commands${wait === undefined ? "" : `?wait=${wait}`}`,
      a.admin,
      {
        kind,
        arguments: args,
      },
    ),
    201,
    `POST ${kind}`,
  )
const get = async (path: string): Promise<Json> =>
  expectStatus(await call(stack, "GET", path, a.admin), 200, `GET ${path}`)
const output = (cid: string, after: number, wait = 0): Promise<Json> =>
  get(`/v1/runs/${run}/commands/${cid}/output?after=${after}&wait=${wait}`)

/** Reads a command's output with long polls until `done`; answers every page. */
const readAll = async (cid: string): Promise<Array<Json>> => {
  const pages: Array<Json> = []
  let after = 0
  for (;;) {
    const page = await output(cid, after, 25)
    pages.push(page)
    after = page.next
    if (page.done) return pages
  }
}

/** Follows the change list with long polls until `until` holds for command `cid`; answers that record. */
const watchCommand = async (cid: string, until: (c: Json) => boolean): Promise<Json> => {
  let since = 0
  for (;;) {
    const page = await get(`/v1/runs/${run}/commands?since=${since}&wait=25`)
    const found = page.commands.find((c: Json) => c.id === cid && until(c))
    if (found) return found
    since = page.sequence
  }
}

describe("commands on a running machine", () => {
  it("a bash command's output streams while it runs, and its record has the result", async () => {
    const sent = await send("bash", { command: "for i in 1 2 3; do echo line$i; sleep 0.4; done" })
    const pages = await readAll(sent.id)
    expect(pages.map((p) => p.output).join("")).toBe("line1\nline2\nline3\n")
    // Only the last page is done; each page moves on from where the previous ended.
    expect(pages.slice(0, -1).every((p) => !p.done)).toBe(true)
    expect(pages.at(-1)).toMatchObject({ next: 18, output_bytes: 18, stored_bytes: 18, done: true })
    const record = await waitCommand(stack, a, run, sent.id)
    expect(record).toMatchObject({
      id: sent.id,
      kind: "bash",
      state: "succeeded",
      source: "caller",
      result: { exit_code: 0, output: "line1\nline2\nline3\n", output_bytes: 18, truncated: false },
    })
    // The same GET with a wait answers at once for an ended command.
    expect(await get(`/v1/runs/${run}/commands/${sent.id}?wait=25`)).toEqual(record)
  })

  it("GET with wait answers when the command ends", async () => {
    const sent = await send("bash", { command: "sleep 1; echo done; exit 3" })
    let record = await get(`/v1/runs/${run}/commands/${sent.id}?wait=25`)
    // A machine still starting can take longer than one wait.
    while (!["succeeded", "failed", "cancelled"].includes(record.state))
      record = await get(`/v1/runs/${run}/commands/${sent.id}?wait=25`)
    expect(record).toMatchObject({ state: "succeeded", result: { exit_code: 3, output: "done\n" } })
  })

  it("a create with wait answers the command as it ended, in one request", async () => {
    // A `read` after the `bash` (arrival order) sees its file: both answered ended by their create.
    const wrote = await send("bash", { command: "echo one-request > w.txt; echo hi; exit 4" }, 25)
    expect(wrote).toMatchObject({
      kind: "bash",
      state: "succeeded",
      result: { exit_code: 4, output: "hi\n" },
    })
    expect(wrote.ended_at).toBeDefined()
    // What the create answered is the stored record.
    expect(await get(`/v1/runs/${run}/commands/${wrote.id}`)).toEqual(wrote)
    const read = await send("read", { file_path: "w.txt" }, 25)
    expect(read).toMatchObject({
      kind: "read",
      state: "succeeded",
      result: { output: expect.stringContaining("one-request") },
    })
  })

  it("output reads are at most 512 KiB and end on whole UTF-8 characters", async () => {
    // "€€€\n" is 10 bytes: 512 KiB = 52,428 lines and 8 bytes, which cut the third € after 2 bytes.
    const sent = await send("bash", { command: "yes '€€€' | head -c 600000" })
    await waitCommand(stack, a, run, sent.id)
    const first = await output(sent.id, 0)
    expect(first.next).toBe(524_286)
    expect(first.output).toBe(`${"€€€\n".repeat(52_428)}€€`)
    expect(first).toMatchObject({ output_bytes: 600_000, stored_bytes: 600_000, done: false })
    const second = await output(sent.id, first.next)
    expect(second.next).toBe(600_000)
    expect(second.done).toBe(true)
    expect(first.output + second.output).toBe("€€€\n".repeat(60_000))
  })

  it("a bash command that prints nothing answers empty output, done once it ended", async () => {
    const sent = await send("bash", { command: "true" })
    const pages = await readAll(sent.id)
    expect(pages.at(-1)).toEqual({ output: "", next: 0, output_bytes: 0, stored_bytes: 0, done: true })
    expect(await waitCommand(stack, a, run, sent.id)).toMatchObject({
      state: "succeeded",
      result: { exit_code: 0, output: "", output_bytes: 0 },
    })
  })

  it("a command other than bash answers empty output, done once it ended", async () => {
    const sent = await send("write", { file_path: "notes/a.txt", content: "hello" })
    const record = await waitCommand(stack, a, run, sent.id)
    expect(record).toMatchObject({ state: "succeeded", result: { bytes: 5 } })
    expect(await output(sent.id, 0, 25)).toEqual({
      output: "",
      next: 0,
      output_bytes: 0,
      stored_bytes: 0,
      done: true,
    })
  })

  it("the change list shows each command at its latest and wakes at the next change", async () => {
    const all = await get(`/v1/runs/${run}/commands?since=0`)
    expect(all.state).toBe("running")
    expect(all.commands.length).toBeGreaterThanOrEqual(4)
    expect(all.commands.every((c: Json) => c.state === "succeeded")).toBe(true)
    // Ordered by change: the sequence of each page is the last change it holds.
    expect(await get(`/v1/runs/${run}/commands?since=${all.sequence}`)).toEqual({
      commands: [],
      state: "running",
      sequence: all.sequence,
    })
    const waiting = get(`/v1/runs/${run}/commands?since=${all.sequence}&wait=25`)
    const sent = await send("bash", { command: "echo again" })
    const woke = await waiting
    expect(woke.commands.map((c: Json) => c.id)).toEqual([sent.id])
    const ended = await waitCommand(stack, a, run, sent.id)
    // Its later changes come after that sequence (unless the wake already saw the command ended:
    // it may run to its end before the woken read): the last one seen is the ended record.
    const later = await get(`/v1/runs/${run}/commands?since=${woke.sequence}`)
    const seen = [...woke.commands, ...later.commands].filter((c: Json) => c.id === sent.id)
    expect(seen.at(-1)).toEqual(ended)
    expect(later.sequence).toBeGreaterThanOrEqual(woke.sequence)
  })

  it("a command still working shows running with the started_at it ends with; a short one ends with its start", async () => {
    const long = await send("bash", { command: "sleep 1" })
    const running = await watchCommand(long.id, (c) => c.state === "running")
    const longEnded = await waitCommand(stack, a, run, long.id)
    expect(longEnded.state).toBe("succeeded")
    expect(longEnded.started_at).toBe(running.started_at)
    expect(Date.parse(longEnded.ended_at) - Date.parse(longEnded.started_at)).toBeGreaterThanOrEqual(900)
    const short = await send("bash", { command: "true" })
    const shortEnded = await waitCommand(stack, a, run, short.id)
    expect(shortEnded.state).toBe("succeeded")
    expect(Date.parse(shortEnded.started_at)).toBeGreaterThanOrEqual(Date.parse(shortEnded.created_at))
    expect(Date.parse(shortEnded.started_at)).toBeLessThanOrEqual(Date.parse(shortEnded.ended_at))
  })

  it("cancel kills a running sleep and answers it cancelled; its output is done", async () => {
    const sent = await send("bash", { command: "echo started; sleep 300" })
    await watchCommand(sent.id, (c) => c.state === "running")
    // Its first output is there before the cancel.
    expect((await output(sent.id, 0, 25)).output).toBe("started\n")
    const cancelled = expectStatus(
      await call(stack, "POST", `/v1/runs/${run}/commands/${sent.id}/cancel`, a.admin),
      200,
      "cancel",
    )
    expect(cancelled).toMatchObject({ id: sent.id, state: "cancelled" })
    expect(cancelled.ended_at).toBeDefined()
    const pages = await readAll(sent.id)
    expect(pages.map((p) => p.output).join("")).toBe("started\n")
    // Cancelling again changes nothing.
    expect(
      expectStatus(
        await call(stack, "POST", `/v1/runs/${run}/commands/${sent.id}/cancel`, a.admin),
        200,
        "cancel again",
      ),
    ).toEqual(cancelled)
    // The machine goes on: the next command runs.
    const after = await waitCommand(stack, a, run, (await send("bash", { command: "echo alive" })).id)
    expect(after).toMatchObject({ state: "succeeded", result: { output: "alive\n" } })
  })

  it("after finish ends the run, commands are refused with 409 run_ended", async () => {
    await waitCommand(
      stack,
      a,
      run,
      (await send("write", { file_path: "out/result.txt", content: "42\n" })).id,
    )
    const finish = await send("finish", { state: "succeeded" })
    const ended = await waitRun(stack, a, run)
    expect(ended.state).toBe("succeeded")
    expect(await waitCommand(stack, a, run, finish.id)).toMatchObject({
      state: "succeeded",
      result: { accepted: true },
    })
    const refused = await call(stack, "POST", `/v1/runs/${run}/commands`, a.admin, {
      kind: "bash",
      arguments: { command: "true" },
    })
    expect({ status: refused.status, code: refused.body?.code }).toEqual({ status: 409, code: "run_ended" })
    expect((await get(`/v1/runs/${run}/commands?since=0`)).state).toBe("succeeded")
  })
})
