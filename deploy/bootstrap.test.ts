// The bootstrap as a process, against temporary tools folders (`HANGAR_TOOLS_DIR`): the real
// fetch from Debian testing, the no-op second run, and the version boundary with fake binaries.
import { execFile } from "node:child_process"
import { existsSync } from "node:fs"
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { delimiter, join } from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { root } from "./tools.mjs"

const script = join(root, "deploy", "bootstrap.mjs")

interface Outcome {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

const bootstrap = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  new Promise<Outcome>((resolve) => {
    execFile(
      process.execPath,
      [script, ...args],
      { env: { ...process.env, ...env } },
      (error, stdout, stderr) => resolve({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr }),
    )
  })

// The real PATH minus any folder holding a nats-server, so the fetch path is taken even on a
// machine that has one installed.
const pathWithoutNats = (process.env.PATH ?? "")
  .split(delimiter)
  .filter((dir) => dir !== "" && !existsSync(join(dir, "nats-server")))
  .join(delimiter)

const temps: Array<string> = []
const tempDir = async () => {
  const dir = await mkdtemp(join(tmpdir(), "hangar-bootstrap-test-"))
  temps.push(dir)
  return dir
}
afterEach(async () => {
  await Promise.all(temps.splice(0).map((dir) => rm(dir, { recursive: true, force: true })))
})

/** A stand-in nats-server that only reports a version. */
const fakeNats = async (version: string) => {
  const dir = await tempDir()
  const binary = join(dir, "nats-server")
  await writeFile(binary, `#!/bin/sh\necho "nats-server: v${version}"\n`)
  await chmod(binary, 0o755)
  return { dir, binary }
}

/** Every file under `dir` with its modification time, to show a run changed nothing. */
const snapshot = async (dir: string) => {
  const entries = await readdir(dir, { recursive: true })
  const times = await Promise.all(
    entries.sort().map(async (entry) => `${entry} ${(await stat(join(dir, entry))).mtimeMs}`),
  )
  return times
}

describe("bootstrap nats-server step", () => {
  it("fetches Debian testing's nats-server into an empty tools folder, then finds it present", async () => {
    const tools = await tempDir()
    const env = { HANGAR_TOOLS_DIR: tools, PATH: pathWithoutNats }

    const first = await bootstrap(["nats-server"], env)
    expect(first.stderr).toBe("")
    expect(first.code).toBe(0)
    expect(first.stdout).toContain("bootstrap: nats-server … fetching Debian testing's package (none on PATH")
    const binary = join(tools, "nats-server", "usr", "sbin", "nats-server")
    expect(first.stdout).toMatch(/bootstrap: nats-server … installed v2\.\d+\.\d+ at /)
    expect(first.stdout).toContain(binary)
    expect((await readFile(join(tools, "nats-server.path"), "utf8")).trim()).toBe(binary)
    const version = await new Promise<string>((resolve, reject) =>
      execFile(binary, ["--version"], (error, stdout) => (error ? reject(error) : resolve(stdout))),
    )
    const [major, minor] = /v(\d+)\.(\d+)/.exec(version)!.slice(1).map(Number) as [number, number]
    expect(major * 1000 + minor).toBeGreaterThanOrEqual(2012)
    // The download folder and the unpack folder are gone; only the tree and the record remain.
    expect((await readdir(tools)).sort()).toEqual(["apt", "nats-server", "nats-server.path"])

    const before = await snapshot(tools)
    const second = await bootstrap(["nats-server"], env)
    expect(second.code).toBe(0)
    expect(second.stdout).toBe(
      `bootstrap: nats-server … present (${version.trim().split(" ")[1]}, ${binary})\n`,
    )
    expect(await snapshot(tools)).toEqual(before)
  })

  it("uses a nats-server on PATH at exactly the minimum version, v2.12.0", async () => {
    const tools = await tempDir()
    const fake = await fakeNats("2.12.0")
    const run = await bootstrap(["nats-server"], { HANGAR_TOOLS_DIR: tools, PATH: fake.dir })
    expect(run.code).toBe(0)
    expect(run.stdout).toBe(`bootstrap: nats-server … using v2.12.0 at ${fake.binary}\n`)
    expect((await readFile(join(tools, "nats-server.path"), "utf8")).trim()).toBe(fake.binary)
  })

  it("rejects v2.11.9 on PATH and, without apt-get, fails saying what to do", async () => {
    const tools = await tempDir()
    const fake = await fakeNats("2.11.9")
    const run = await bootstrap(["nats-server"], { HANGAR_TOOLS_DIR: tools, PATH: fake.dir })
    expect(run.code).toBe(1)
    expect(run.stdout).toContain(`${fake.binary} is v2.11.9; need ≥ v2.12.0`)
    expect(run.stderr).toContain("bootstrap: nats-server failed: need apt-get and dpkg")
    expect(run.stderr).toContain("install nats-server ≥ 2.12.0 on PATH instead")
    expect(existsSync(join(tools, "nats-server.path"))).toBe(false)
  })

  it("replaces a recorded binary that is too old", async () => {
    const tools = await tempDir()
    const old = await fakeNats("2.11.9")
    const good = await fakeNats("2.12.0")
    await mkdir(tools, { recursive: true })
    await writeFile(join(tools, "nats-server.path"), `${old.binary}\n`)
    const run = await bootstrap(["nats-server"], { HANGAR_TOOLS_DIR: tools, PATH: good.dir })
    expect(run.code).toBe(0)
    expect(run.stdout).toBe(`bootstrap: nats-server … using v2.12.0 at ${good.binary}\n`)
    expect((await readFile(join(tools, "nats-server.path"), "utf8")).trim()).toBe(good.binary)
  })

  it("refuses an unknown step", async () => {
    const run = await bootstrap(["nats"], { HANGAR_TOOLS_DIR: await tempDir() })
    expect(run.code).toBe(2)
    expect(run.stderr).toBe("bootstrap: unknown step nats (steps: npm, nats-server, debian)\n")
  })
})
