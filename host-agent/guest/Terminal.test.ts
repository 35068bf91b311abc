import { Chunk, Deferred, Effect, Fiber, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { open } from "./Terminal.ts"
import { type TestGuest, testGuest } from "./testing.ts"

let t: TestGuest

beforeAll(async () => {
  t = await testGuest("term")
}, 15 * 60_000)

afterAll(async () => {
  expect(await t.close()).toEqual([])
})

// Opens a terminal, types `input`, and collects everything it shows until the shell exits.
const session = (
  input: ReadonlyArray<string>,
  args: { rows?: number; cols?: number; env?: Record<string, string> } = {},
  between?: (term: Effect.Effect.Success<ReturnType<typeof open>>) => Effect.Effect<void, unknown>,
) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const term = yield* open(t.guest, {
          rows: args.rows ?? 24,
          cols: args.cols ?? 80,
          ...(args.env ? { env: args.env } : {}),
        })
        const reader = yield* Effect.fork(Stream.runCollect(term.output))
        if (between) yield* between(term)
        for (const line of input) yield* term.write(Buffer.from(line))
        const code = yield* Deferred.await(term.exit)
        const output = Buffer.concat(Chunk.toReadonlyArray(yield* Fiber.join(reader))).toString("utf8")
        return { code, output }
      }),
    ),
  )

describe("terminal", () => {
  it("is a login shell as root in /workspace and reports its exit status", async () => {
    const r = await session(['echo "$PWD:$(id -u):$0"; exit 3\n'])
    expect(r.code).toBe(3)
    expect(r.output).toContain("/workspace:0:-")
  })

  it("has the run's variables", async () => {
    const r = await session(['echo "[$RUN_VAR]"; exit 0\n'], { env: { RUN_VAR: "a b 'c'" } })
    expect(r.code).toBe(0)
    expect(r.output).toContain("[a b 'c']")
  })

  it("starts at the given size and follows a resize", async () => {
    const r = await session(["stty size; exit\n"], { rows: 30, cols: 100 })
    expect(r.output).toContain("30 100")
    const resized = await session(["stty size; exit 0\n"], { rows: 30, cols: 100 }, (term) =>
      term.resize(50, 132),
    )
    expect(resized.output).toContain("50 132")
    expect(resized.output).not.toContain("30 100")
  })

  it("refuses sizes outside 1 to 65535", async () => {
    const exit = await Effect.runPromiseExit(Effect.scoped(open(t.guest, { rows: 0, cols: 80 })))
    expect(String(exit)).toContain("rows")
    const wide = await Effect.runPromiseExit(Effect.scoped(open(t.guest, { rows: 24, cols: 65536 })))
    expect(String(wide)).toContain("cols")
  })
})
