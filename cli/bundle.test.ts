// The CLI bundle's `import.meta.url` plugin (`cli/bundle.mjs`), on a fixture bundled as
// `cli/bin.js` bundles the CLI: a module that finds its folder from its own URL.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { build } from "esbuild"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { sourceUrls } from "./bundle.mjs"

let dir = ""
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-bundle-"))
  await mkdir(join(dir, "core"))
  await writeFile(join(dir, "core", "where.ts"), "export const where: string = import.meta.url\n")
  await writeFile(join(dir, "main.ts"), 'export { where } from "./core/where.ts"\n')
})
afterAll(() => rm(dir, { recursive: true, force: true }))

const bundled = async (name: string, plugins: Array<typeof sourceUrls>) => {
  await build({
    entryPoints: { [name]: join(dir, "main.ts") },
    outdir: join(dir, "out"),
    outExtension: { ".js": ".mjs" },
    bundle: true,
    format: "esm",
    platform: "node",
    logLevel: "silent",
    plugins,
  })
  return ((await import(pathToFileURL(join(dir, "out", `${name}.mjs`)).href)) as { where: string }).where
}

describe("the CLI bundle", () => {
  it("gives a bundled module its source file's import.meta.url, not the bundle's", async () => {
    expect(await bundled("with", [sourceUrls])).toBe(pathToFileURL(join(dir, "core", "where.ts")).href)
    // Without the plugin the module sees the bundle's place (what it would find beside it is wrong).
    expect(await bundled("without", [])).toBe(pathToFileURL(join(dir, "out", "without.mjs")).href)
  })
})
