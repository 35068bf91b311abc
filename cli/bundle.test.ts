// The CLI bundle: `cli/bin.cjs` making, keeping and remaking it in a tools folder of its own (real
// processes), and its `import.meta.url` plugin (`core/SourceUrls.mjs`) on a fixture bundled as
// `cli/bin.cjs` bundles the CLI (one CommonJS file): a module that finds its folder from its own URL.
import { spawnSync } from "node:child_process"
import { readFileSync, statSync, utimesSync, writeFileSync } from "node:fs"
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { build } from "esbuild"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sourceUrls } from "../core/SourceUrls.mjs"

let dir = ""
let tools = ""
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-bundle-"))
  tools = await mkdtemp(join(tmpdir(), "hangar-bundle-tools-"))
  await mkdir(join(dir, "core"))
  await writeFile(join(dir, "core", "where.ts"), "export const where: string = import.meta.url\n")
  await writeFile(join(dir, "main.ts"), 'export { where } from "./core/where.ts"\n')
})
afterAll(async () => {
  await rm(dir, { recursive: true, force: true })
  await rm(tools, { recursive: true, force: true })
})

/** `hangar ARGS` with the tools folder `tools`: its status, output, and the bundle it ran from. */
const hangar = (...args: Array<string>) => {
  const ran = spawnSync(process.execPath, [join(import.meta.dirname, "bin.cjs"), ...args], {
    env: { ...process.env, HANGAR_TOOLS_DIR: tools },
    encoding: "utf8",
  })
  return { status: ran.status, stdout: ran.stdout, stderr: ran.stderr, bundle: current() }
}
const version = `${JSON.parse(readFileSync(join(import.meta.dirname, "..", "package.json"), "utf8")).version}\n`
const current = () => readFileSync(join(tools, "cli", "current"), "utf8")

const bundled = async (name: string, plugins: Array<typeof sourceUrls>) => {
  await build({
    entryPoints: { [name]: join(dir, "main.ts") },
    outdir: join(dir, "out"),
    outExtension: { ".js": ".cjs" },
    bundle: true,
    format: "cjs",
    platform: "node",
    logLevel: "silent",
    plugins,
  })
  return (createRequire(import.meta.url)(join(dir, "out", `${name}.cjs`)) as { where: string | undefined })
    .where
}

describe("the CLI bundle", () => {
  it("is made on the first start, kept while it is newer than its sources, and made again when it is not", () => {
    const first = hangar("version")
    expect(first).toMatchObject({ status: 0, stdout: version })
    // The operator commands, from the same bundle: effect and the NATS client are in it, and the
    // CommonJS packages' require finds what they need from the repository, not from the tools folder.
    const admin = hangar("admin")
    expect(admin).toMatchObject({ status: 2, bundle: first.bundle })
    expect(admin.stderr).toContain("usage:")
    // Each file's first start wrote V8's code cache of it; the next is served by it, and one V8
    // refuses (damaged here; another Node.js would do the same) is written again.
    for (const [file, args] of [
      ["main.cjs", ["version"]],
      ["admin.cjs", ["admin"]],
    ] as const) {
      const cache = join(tools, "cli", first.bundle, `${file}.v8`)
      const written = statSync(cache)
      expect(written.size).toBeGreaterThan(0)
      expect(hangar(...args)).toMatchObject({ status: file === "admin.cjs" ? 2 : 0, bundle: first.bundle })
      expect(statSync(cache).mtimeMs).toBe(written.mtimeMs)
      writeFileSync(cache, "not a code cache")
      expect(hangar(...args)).toMatchObject({ status: file === "admin.cjs" ? 2 : 0, bundle: first.bundle })
      expect(readFileSync(cache, "utf8")).not.toBe("not a code cache")
      const again = statSync(cache)
      expect(again.size).toBeGreaterThan(0)
      expect(hangar(...args).bundle).toBe(first.bundle)
      expect(statSync(cache).mtimeMs).toBe(again.mtimeMs)
    }
    // What it was made from: the CLI's sources, not the packages' files (the lock files stand for them).
    const inputs: Array<string> = JSON.parse(
      readFileSync(join(tools, "cli", first.bundle, "inputs.json"), "utf8"),
    ).inputs
    expect(inputs).toContain("cli/user/main.ts")
    expect(inputs).toContain("cli/admin.ts")
    expect(inputs.filter((input) => input.includes("node_modules"))).toEqual([])
    // Older than its sources and makers (as after a change to any of them): made again.
    const past = new Date("2020-01-01T00:00:00Z")
    utimesSync(join(tools, "cli", first.bundle, "main.cjs"), past, past)
    const again = hangar("version")
    expect(again).toMatchObject({ status: 0, stdout: version })
    expect(again.bundle).not.toBe(first.bundle)
    expect(hangar("version").bundle).toBe(again.bundle)
  })

  it("gives a bundled module its source file's import.meta.url, not the bundle's", async () => {
    expect(await bundled("with", [sourceUrls])).toBe(pathToFileURL(join(dir, "core", "where.ts")).href)
    // Without the plugin a CommonJS bundle has no import.meta.url at all (esbuild leaves it empty).
    expect(await bundled("without", [])).toBeUndefined()
  })
})
