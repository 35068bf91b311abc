// What bundling our TypeScript with esbuild needs beyond esbuild itself: the CLI's bundles
// (`cli/bin.cjs`, loaded only when it bundles) and the machine thread's (`NamespaceDriver.ts`).
import { readFileSync } from "node:fs"
import { pathToFileURL } from "node:url"

/**
 * An esbuild plugin: a bundled module's `import.meta.url` is its source file's, as under tsx, so
 * code that finds files beside its own (`core/DataDir.ts`: the repository's root, and so `.data/`)
 * finds the same ones from the bundle in `.tools/cli/`, and the machine thread's tools
 * (`exec-helper.py`, `machine-root.pl`) are found beside their sources.
 */
export const sourceUrls = {
  name: "source-urls",
  setup(build) {
    build.onLoad({ filter: /\.ts$/ }, (args) => {
      const text = readFileSync(args.path, "utf8")
      if (!text.includes("import.meta.url")) return undefined
      return {
        contents: text.replaceAll("import.meta.url", JSON.stringify(pathToFileURL(args.path).href)),
        loader: "ts",
      }
    })
  },
}
