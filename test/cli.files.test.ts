/**
 * Files through the `hangar` CLI, as a user moves them: the real binary (`cli/bin.cjs`) against the
 * whole stack. `cp` of a file and of a nested folder into a run and back out, byte for byte; `cp`
 * out of a path the machine does not have (exit 4, the spec's "anything else"); and `hangar run
 * --in DIR --out DIR2` and `hangar output RUN --out DIR` round trips of a folder holding nested
 * files and a 100 MB file, for a function with `provider: "none"` that the test ends through the
 * API (a `bash` copying `/workspace/in` to `/workspace/out`, then `finish`).
 */
import { createHash, randomBytes } from "node:crypto"
import {
  chmodSync,
  createReadStream,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs"
import { tmpdir } from "node:os"
import { join, relative } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { configHome, hangar, type Ran, type RunOptions } from "./harness/Cli.ts"
import {
  call,
  closeStack,
  command,
  createAccount,
  expectStatus,
  type Json,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

const MB = 1_000_000

let stack: Stack
let acct: TestAccount
let key: string
let fn: string
let work: string
let home: string

beforeAll(async () => {
  home = configHome()
  stack = await startStack({ logFlushMs: 300 })
  acct = await createAccount(stack)
  key = (acct.admin.authorization ?? "").replace(/^Bearer /, "")
  fn = (await publish(stack, acct, { name: "cli-files", timeout_minutes: 30 })).function
  work = mkdtempSync(join(tmpdir(), "hangar-cli-files-"))
}, 120_000)

afterAll(async () => {
  if (work) rmSync(work, { recursive: true, force: true })
  if (home) rmSync(home, { recursive: true, force: true })
  await closeStack(stack)
}, 120_000)

/** `hangar …` as this account's admin key. */
const cli = (args: ReadonlyArray<string>, options: RunOptions = {}): Promise<Ran> =>
  hangar(args, {
    timeoutMs: 240_000,
    ...options,
    env: { SERVICE_API: stack.url, SERVICE_KEY: key, XDG_CONFIG_HOME: home, ...options.env },
  })

const expectExit = (ran: Ran, status: number): Ran => {
  expect(ran.status, `status ${ran.status}\nstdout: ${ran.stdout}\nstderr: ${ran.stderr}`).toBe(status)
  return ran
}

const sha256File = (path: string): Promise<string> =>
  new Promise((resolve, reject) => {
    const hash = createHash("sha256")
    createReadStream(path)
      .on("data", (c) => hash.update(c))
      .on("error", reject)
      .on("end", () => resolve(hash.digest("hex")))
  })

/** Every file and folder under `dir` (relative; folders end in `/`) with each file's SHA-256. */
const tree = async (dir: string): Promise<Record<string, string>> => {
  const found: Record<string, string> = {}
  const walk = async (at: string) => {
    for (const name of readdirSync(at).sort()) {
      const p = join(at, name)
      const s = lstatSync(p)
      if (s.isDirectory()) {
        found[`${relative(dir, p)}/`] = "folder"
        await walk(p)
      } else found[relative(dir, p)] = s.isFile() ? await sha256File(p) : "not a regular file"
    }
  }
  await walk(dir)
  return found
}

/** A fresh local folder under the test's. */
const fresh = (name: string) => {
  const dir = join(work, `${name}-${randomBytes(4).toString("hex")}`)
  mkdirSync(dir, { recursive: true })
  return dir
}

/** Writes `bytes` random bytes to `path` in 8 MB pieces. */
const randomFile = (path: string, bytes: number) => {
  writeFileSync(path, "")
  for (let left = bytes; left > 0; left -= 8 * MB)
    writeFileSync(path, randomBytes(Math.min(left, 8 * MB)), { flag: "a" })
}

/** A nested folder: files at three depths, an empty folder, an empty file, a UTF-8 and a spaced name. */
const nestedFolder = (name: string, big = 0): string => {
  const dir = fresh(name)
  mkdirSync(join(dir, "a", "b", "c"), { recursive: true })
  mkdirSync(join(dir, "empty"))
  writeFileSync(join(dir, "result.txt"), "the result\n")
  writeFileSync(join(dir, "a", "one.txt"), "one\n")
  writeFileSync(join(dir, "a", "b", "two words.md"), "# two\n")
  writeFileSync(join(dir, "a", "b", "c", "données.bin"), randomBytes(300_000))
  writeFileSync(join(dir, "a", "b", "c", "empty.txt"), "")
  writeFileSync(join(dir, "script.sh"), "#!/bin/sh\necho hi\n")
  chmodSync(join(dir, "script.sh"), 0o755)
  if (big > 0) randomFile(join(dir, "a", "big.bin"), big)
  return dir
}

/** The run the CLI started last for `fn` (the API lists newest first). */
const newestRun = async (): Promise<Json> => {
  const page = expectStatus(
    await call(stack, "GET", `/v1/runs?function=${fn}`, acct.admin),
    200,
    "GET /v1/runs",
  )
  return page.runs[0]
}

/** Copies the run's input to its output and finishes it succeeded. */
const copyInToOutAndFinish = async (run: string) => {
  const copied = await command(stack, acct, run, "bash", { command: "cp -r /workspace/in/. /workspace/out/" })
  expect(copied.state, JSON.stringify(copied)).toBe("succeeded")
  expect(copied.result.exit_code, JSON.stringify(copied)).toBe(0)
  const finish = await command(stack, acct, run, "finish", { state: "succeeded" })
  expect(finish.result?.accepted, JSON.stringify(finish)).toBe(true)
}

describe("cp", () => {
  let run: string

  beforeAll(async () => {
    run = (await startRun(stack, acct, fn)).id
  }, 60_000)

  afterAll(async () => {
    if (run === undefined) return
    await command(stack, acct, run, "finish", { state: "failed", detail: "cp tests done" })
    await waitRun(stack, acct, run)
  }, 120_000)

  it("a file into a run and back out, byte for byte; into a folder path and onto an existing folder", async () => {
    const dir = fresh("file")
    const local = join(dir, "blob.bin")
    randomFile(local, 5 * MB + 123)
    const put = expectExit(await cli(["cp", local, `${run}:/workspace/x/y/blob.bin`, "--json"]), 0)
    const record = JSON.parse(put.stdout)
    expect(record).toMatchObject({ kind: "put", state: "succeeded", result: { bytes: 5 * MB + 123 } })

    const back = join(dir, "back.bin")
    expectExit(await cli(["cp", `${run}:/workspace/x/y/blob.bin`, back]), 0)
    expect(readFileSync(back).equals(readFileSync(local))).toBe(true)

    // A relative path resolves from /workspace; a trailing slash keeps the file's own name.
    expectExit(await cli(["cp", local, `${run}:x/z/`]), 0)
    const listed = await command(stack, acct, run, "bash", { command: "sha256sum /workspace/x/z/blob.bin" })
    expect(listed.result.output).toContain(await sha256File(local))

    // Out onto an existing local folder: the file lands in it under its own name.
    const into = fresh("into")
    expectExit(await cli(["cp", `${run}:x/z/blob.bin`, into]), 0)
    expect(readdirSync(into)).toEqual(["blob.bin"])
    expect(readFileSync(join(into, "blob.bin")).equals(readFileSync(local))).toBe(true)
  }, 300_000)

  it("a nested folder into a run and back out, every file byte for byte", async () => {
    const dir = nestedFolder("folder", 12 * MB)
    const put = expectExit(await cli(["cp", dir, `${run}:/workspace/tree`, "--json"]), 0)
    expect(JSON.parse(put.stdout)).toMatchObject({
      kind: "bash",
      state: "succeeded",
      result: { exit_code: 0 },
    })
    // The temporary archive is gone from the machine.
    const left = await command(stack, acct, run, "bash", {
      command: "ls -A /tmp | grep -c hangar-cp || true",
    })
    expect(left.result.output.trim()).toBe("0")

    const back = join(fresh("back"), "tree")
    const got = expectExit(await cli(["cp", `${run}:tree`, back, "--json"]), 0)
    expect(JSON.parse(got.stdout)).toMatchObject({ kind: "get", state: "succeeded" })
    expect(await tree(back)).toEqual(await tree(dir))
    expect(statSync(join(back, "script.sh")).mode & 0o111).not.toBe(0)

    // A file named like an archive comes back as that file, not unpacked.
    const archiveLike = join(fresh("gz"), "data.tar.gz")
    writeFileSync(archiveLike, randomBytes(4096))
    expectExit(await cli(["cp", archiveLike, `${run}:gz/data.tar.gz`]), 0)
    const again = join(fresh("gz-back"), "copy.tar.gz")
    expectExit(await cli(["cp", `${run}:gz/data.tar.gz`, again]), 0)
    expect(readFileSync(again).equals(readFileSync(archiveLike))).toBe(true)
  }, 300_000)

  it("a folder holding a symbolic link is refused before anything is sent (exit 4, naming it)", async () => {
    const dir = nestedFolder("linked")
    symlinkSync("/etc/hostname", join(dir, "a", "link"))
    const ran = expectExit(await cli(["cp", dir, `${run}:/workspace/linked`]), 4)
    expect(ran.stderr).toContain(join(dir, "a", "link"))
    const seen = await command(stack, acct, run, "bash", { command: "test -e /workspace/linked; echo $?" })
    expect(seen.result.output.trim()).toBe("1")
  }, 120_000)

  it("out of a path the machine does not have: exit 4 with the machine's message, nothing written", async () => {
    const dir = fresh("missing")
    const ran = expectExit(await cli(["cp", `${run}:/workspace/no/such/thing`, join(dir, "x")]), 4)
    expect(ran.stderr).toContain("/workspace/no/such/thing: no such file or folder")
    expect(readdirSync(dir)).toEqual([])
  }, 120_000)

  it("wrong commands exit 2; a run that is not there exits 3", async () => {
    expectExit(await cli(["cp", "a", "b"]), 2)
    expectExit(await cli(["cp", `${run}:a`, `${run}:b`]), 2)
    expectExit(await cli(["cp", "only-one"]), 2)
    const dir = fresh("noone")
    writeFileSync(join(dir, "f"), "f")
    const ran = expectExit(await cli(["cp", join(dir, "f"), "run_00000000000000000000000000:f"]), 3)
    expect(ran.stderr).toContain("not_found")
  }, 120_000)
})

describe("run --in / --out and output", () => {
  it("hangar run FN --prompt x --in DIR --out DIR2: a nested folder with a 100 MB file, back byte for byte", async () => {
    const input = nestedFolder("run-in", 100 * MB)
    const output = join(fresh("run-out"), "result")
    const started = Date.now()
    const running = cli(["run", fn, "--prompt", "copy the input", "--in", input, "--out", output], {
      timeoutMs: 280_000,
    })
    // The CLI uploads, starts the run and follows it; the test plays the agent through the API.
    const acted = (async () => {
      for (;;) {
        const newest = await newestRun()
        if (newest !== undefined && Date.parse(newest.created_at) >= started - 1000) {
          stack.runs.add(newest.id)
          await copyInToOutAndFinish(newest.id)
          return
        }
        await new Promise((r) => setTimeout(r, 250))
      }
    })()
    const ran = await running
    await acted
    expectExit(ran, 0)
    expect(await tree(output)).toEqual(await tree(input))
    expect(await sha256File(join(output, "a", "big.bin"))).toBe(await sha256File(join(input, "a", "big.bin")))
  }, 300_000)

  it("hangar run --detach --json, then hangar output RUN --out DIR", async () => {
    const input = nestedFolder("detach-in", 100 * MB)
    const started = expectExit(
      await cli(["run", fn, "--prompt", "copy the input", "--in", input, "--detach", "--json"]),
      0,
    )
    const run = JSON.parse(started.stdout) as Json
    expect(run.id).toMatch(/^run_/)
    expect(run.input).toMatch(/^file_/)
    stack.runs.add(run.id)
    await copyInToOutAndFinish(run.id)
    expect((await waitRun(stack, acct, run.id)).state).toBe("succeeded")
    const output = fresh("detach-out")
    const ran = expectExit(await cli(["output", run.id, "--out", output, "--json"]), 0)
    const shown = JSON.parse(ran.stdout) as Json
    expect(shown.file_count).toBeGreaterThanOrEqual(7)
    expect(await tree(output)).toEqual(await tree(input))
  }, 300_000)
})
