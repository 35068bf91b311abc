/**
 * The real `hangar` binary (`cli/bin.cjs`, what `npx hangar` runs) as a subprocess, for the CLI's
 * tests: its exit status, stdout and stderr, with the environment a user would set.
 */
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { root } from "../../deploy/tools.mjs"

/** The binary's path. */
export const bin = join(root, "cli", "bin.cjs")

/** What one invocation did. */
export interface Ran {
  readonly status: number | null
  readonly stdout: string
  readonly stderr: string
}

export interface RunOptions {
  /** Variables over a clean environment (PATH and HOME are kept). */
  readonly env?: Readonly<Record<string, string | undefined>>
  /** Written to stdin, then closed (stdin is closed empty when not given). */
  readonly input?: string | Buffer
  readonly cwd?: string
  /** Killed (SIGKILL) after this long; default 120 s. */
  readonly timeoutMs?: number
  /** Called with each chunk of stdout as it comes (to act while it runs). */
  readonly onStdout?: (chunk: string, child: ReturnType<typeof spawn>) => void
  /** Called with each chunk of stderr as it comes. */
  readonly onStderr?: (chunk: string, child: ReturnType<typeof spawn>) => void
}

let homes: string | undefined

/**
 * Removes the config folders made so far: after each test file (`test/harness/setup.ts`, which
 * vitest runs for every file, where this module is loaded once per fork). An exit handler did not
 * run: vitest ends its forked workers with a signal.
 */
export const removeConfigHomes = (): void => {
  if (homes !== undefined) rmSync(homes, { recursive: true, force: true })
  homes = undefined
}

/**
 * A fresh config folder (`XDG_CONFIG_HOME`), so no test sees another's saved key. They are made in
 * one temporary folder per test file, removed after it.
 */
export const configHome = (): string => {
  homes ??= mkdtempSync(join(tmpdir(), "hangar-cli-config-"))
  return mkdtempSync(join(homes, "home-"))
}

/** Runs `hangar …args`. */
export const hangar = (args: ReadonlyArray<string>, options: RunOptions = {}): Promise<Ran> =>
  new Promise((resolve, reject) => {
    const env: Record<string, string> = { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/root" }
    for (const [k, v] of Object.entries(options.env ?? {})) if (v !== undefined) env[k] = v
    const child = spawn(process.execPath, [bin, ...args], {
      env,
      cwd: options.cwd ?? root,
      stdio: ["pipe", "pipe", "pipe"],
    })
    let stdout = ""
    let stderr = ""
    child.stdout.setEncoding("utf8").on("data", (c: string) => {
      stdout += c
      options.onStdout?.(c, child)
    })
    child.stderr.setEncoding("utf8").on("data", (c: string) => {
      stderr += c
      options.onStderr?.(c, child)
    })
    const timer = setTimeout(() => child.kill("SIGKILL"), options.timeoutMs ?? 120_000)
    child.on("error", reject)
    child.on("close", (status) => {
      clearTimeout(timer)
      resolve({ status, stdout, stderr })
    })
    child.stdin.on("error", () => undefined)
    child.stdin.end(options.input ?? "")
  })
