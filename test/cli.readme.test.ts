/**
 * The README's "First run in five minutes" block, run as it is written (bash, `npx hangar` being
 * the real binary) against the whole stack, so the walk-through a new user follows keeps working.
 */
import { spawn } from "node:child_process"
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, expect, it } from "vitest"
import { root } from "../deploy/tools.mjs"
import { bin, configHome } from "./harness/Cli.ts"
import { closeStack, createAccount, type Stack, startStack, type TestAccount } from "./harness/Stack.ts"

let stack: Stack
let acct: TestAccount

beforeAll(async () => {
  stack = await startStack()
  acct = await createAccount(stack)
}, 120_000)

// The walk-through's folders, removed with the file's end.
const made: Array<string> = []
afterAll(async () => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true })
  await closeStack(stack)
}, 120_000)

/** The shell block of the README's walk-through. */
const walkThrough = (): string => {
  const readme = readFileSync(join(root, "README.md"), "utf8")
  const section = readme.split("## First run in five minutes")[1]?.split("\n## ")[0] ?? ""
  const block = /```sh\n([\s\S]*?)```/.exec(section)?.[1]
  if (block === undefined) throw new Error("the README has no walk-through block")
  return block
}

it("the README's first run works as written: publish, run with input, exec, finish, output → 42", async () => {
  const block = walkThrough()
  expect(block).toContain("npx hangar publish")
  const dir = mkdtempSync(join(tmpdir(), "hangar-readme-"))
  // `npx hangar` is the binary of this checkout (npx itself would look it up in the project).
  const shims = mkdtempSync(join(tmpdir(), "hangar-readme-bin-"))
  made.push(dir, shims)
  writeFileSync(
    join(shims, "npx"),
    `#!/bin/sh\n[ "$1" = hangar ] || { echo "unexpected npx $*" >&2; exit 99; }\nshift\nexec "${process.execPath}" "${bin}" "$@"\n`,
  )
  chmodSync(join(shims, "npx"), 0o755)
  // The key line is the user's to fill in: the test's admin key stands in for it.
  const script = block.replace(/^export SERVICE_KEY=.*$/m, "")
  const ran = await new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn("bash", ["-euo", "pipefail", "-c", script], {
      cwd: dir,
      // No stdin: on a socket (a pipe from node is one) bash takes itself for a remote shell and
      // reads the system's bashrc, which need not hold under `-u`.
      stdio: ["ignore", "pipe", "pipe"],
      env: {
        PATH: `${shims}:${process.env.PATH}`,
        HOME: dir,
        XDG_CONFIG_HOME: configHome(),
        SERVICE_API: stack.url,
        SERVICE_KEY: (acct.admin.authorization ?? "").replace(/^Bearer /, ""),
      },
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (c) => {
      stdout += c
    })
    child.stderr.on("data", (c) => {
      stderr += c
    })
    child.on("close", (status) => resolve({ status, stdout, stderr }))
  })
  expect(ran.status, `stdout: ${ran.stdout}\nstderr: ${ran.stderr}`).toBe(0)
  expect(ran.stdout.trim().split("\n").at(-1)).toBe("42")
  expect(readFileSync(join(dir, "answer", "answer.txt"), "utf8")).toBe("42\n")
}, 180_000)
