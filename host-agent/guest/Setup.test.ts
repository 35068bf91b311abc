import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { failureDetail, run } from "./Setup.ts"
import { type TestGuest, testGuest } from "./testing.ts"

let t: TestGuest

beforeAll(async () => {
  t = await testGuest("setup")
}, 15 * 60_000)

afterAll(async () => {
  expect(await t.close()).toEqual([])
})

const setup = (commands: ReadonlyArray<string>, env?: Record<string, string>) =>
  Effect.runPromise(run(t.guest, commands, env ? { env } : {}))

describe("setup", () => {
  it("runs every command in order as root in /workspace with the environment", async () => {
    const r = await setup(
      ["echo one > /workspace/order", 'echo "$GREETING" >> order; id -u', "pwd; cat order"],
      { GREETING: 'it\'s "quoted"' },
    )
    expect(r.failed).toBeUndefined()
    expect(r.steps.map((s) => s.exit_code)).toEqual([0, 0, 0])
    expect(r.steps[1]?.output).toBe("0\n")
    expect(r.steps[2]?.output).toBe(`/workspace\none\nit's "quoted"\n`)
    expect(r.steps[2]?.output_bytes).toBe(Buffer.byteLength(`/workspace\none\nit's "quoted"\n`))
    for (const s of r.steps) expect(Date.parse(s.ended_at)).toBeGreaterThanOrEqual(Date.parse(s.started_at))
    expect(failureDetail(r)).toBeUndefined()
  })

  it("a failing second command stops setup: the third never runs", async () => {
    const r = await setup(["echo first", "echo 'about to fail' >&2; exit 7", "touch /workspace/third-ran"])
    expect(r.failed).toBe(1)
    expect(r.steps).toHaveLength(2)
    expect(r.steps[1]).toMatchObject({ command: "echo 'about to fail' >&2; exit 7", exit_code: 7 })
    expect(r.steps[1]?.output).toBe("about to fail\n")
    expect(failureDetail(r)).toBe(
      "setup command 2 exited 7: echo 'about to fail' >&2; exit 7\nabout to fail\n",
    )
    const check = await Effect.runPromise(t.guest.bash({ command: "ls /workspace/third-ran 2>&1; true" }))
    expect(check.output).toContain("No such file")
  })

  it("runs with -e, -u and pipefail", async () => {
    const e = await setup(["false; echo after-false"])
    expect(e.failed).toBe(0)
    expect(e.steps[0]?.output).toBe("")
    const u = await setup(["echo $NOT_SET_ANYWHERE"])
    expect(u.failed).toBe(0)
    expect(u.steps[0]?.output).toContain("NOT_SET_ANYWHERE: unbound variable")
    const p = await setup(["false | true"])
    expect(p.failed).toBe(0)
    expect(p.steps[0]?.exit_code).toBe(1)
  })

  it("an empty setup succeeds", async () => {
    expect(await setup([])).toEqual({ steps: [] })
  })
})
