import { Effect, Exit } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { COLLECT_STDOUT_MAX_BYTES, collect } from "./Channel.ts"
import { type TestGuest, testGuest } from "./testing.ts"

let t: TestGuest

beforeAll(async () => {
  t = await testGuest("channel")
}, 15 * 60_000)

afterAll(async () => {
  expect(await t.close()).toEqual([])
})

const run = (script: string, input?: Uint8Array) => Effect.runPromiseExit(collect(t.guest, script, input))

describe("collect", () => {
  it("answers a short script's stdout, stderr and status, with its input on stdin", async () => {
    const exit = await run("cat; echo err >&2; exit 3", Buffer.from("in\n"))
    expect(Exit.isSuccess(exit) && exit.value).toEqual({
      code: 3,
      stdout: Buffer.from("in\n"),
      stderr: "err\n",
    })
  })

  it("takes exactly 1 MiB of stdout whole and fails one byte more", async () => {
    const at = await run(`head -c ${COLLECT_STDOUT_MAX_BYTES} /dev/zero`)
    expect(Exit.isSuccess(at) && at.value.stdout.length).toBe(COLLECT_STDOUT_MAX_BYTES)
    const over = await run(`head -c ${COLLECT_STDOUT_MAX_BYTES + 1} /dev/zero`)
    expect(String(over)).toContain(`the machine answered more than ${COLLECT_STDOUT_MAX_BYTES} bytes`)
  })

  it("a program that floods stdout and never ends fails at the cap, without waiting for its end", async () => {
    // The tenant's machine: any program a script runs may do this. Past the cap the channel is
    // closed and the call fails; the program sleeps on (the machine goes with the run).
    const exit = await run("head -c 20M /dev/zero; exec sleep 600")
    expect(String(exit)).toContain(`more than ${COLLECT_STDOUT_MAX_BYTES} bytes`)
    // The session goes on.
    expect(Exit.isSuccess(await run("echo still"))).toBe(true)
  })

  it("keeps only the last 16 KiB of stderr", async () => {
    const exit = await run("head -c 100000 /dev/zero | tr '\\0' a >&2; printf END >&2; echo ok")
    if (!Exit.isSuccess(exit)) throw new Error(String(exit))
    expect(exit.value.stdout.toString()).toBe("ok\n")
    expect(exit.value.stderr.length).toBe(16 * 1024)
    expect(exit.value.stderr.endsWith("aaaEND")).toBe(true)
  })
})
