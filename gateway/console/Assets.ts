/**
 * The web console's front end (`console/`, Preact), bundled by esbuild into memory the first time a
 * gateway serves a console page, then kept for the process's life. Output names carry a hash of
 * their content (`/assets/app-<hash>.js`), so every gateway built from the same sources serves the
 * same names, and a browser may keep them forever; the HTML page that names them is never cached.
 *
 * Built in memory rather than into `.tools/`: nothing is shared between processes, so concurrent
 * gateways (or a gateway beside the tests) never see a half-written folder, and an API-only
 * gateway that never serves a page pays nothing.
 */
import { fileURLToPath } from "node:url"
import { Context, Effect, Layer } from "effect"

/** One built file. */
export interface Asset {
  readonly body: Uint8Array
  readonly contentType: string
}

/** The built console: its assets by file name, and the page that loads them. */
export interface Built {
  readonly assets: ReadonlyMap<string, Asset>
  readonly html: string
}

/** A failure to bundle the console (a defect of the sources). */
export class ConsoleBuildError extends Error {
  readonly _tag = "ConsoleBuildError"
}

/** The console's assets, built once per process on first use. */
export class ConsoleAssets extends Context.Tag("gateway/ConsoleAssets")<
  ConsoleAssets,
  { readonly built: Effect.Effect<Built, ConsoleBuildError> }
>() {}

const entry = fileURLToPath(new URL("../../console/main.tsx", import.meta.url))

const typeOf = (name: string) =>
  name.endsWith(".js")
    ? "text/javascript; charset=utf-8"
    : name.endsWith(".css")
      ? "text/css; charset=utf-8"
      : name.endsWith(".woff2")
        ? "font/woff2"
        : "application/octet-stream"

const page = (script: string, style: string | undefined) => `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>Hangar</title>
${style === undefined ? "" : `<link rel="stylesheet" href="/assets/${style}">\n`}<script type="module" src="/assets/${script}"></script>
</head>
<body><div id="app"></div></body>
</html>
`

/** Bundles the console. */
export const build: Effect.Effect<Built, ConsoleBuildError> = Effect.tryPromise({
  try: async () => {
    const esbuild = await import("esbuild")
    const result = await esbuild.build({
      entryPoints: { app: entry },
      outdir: "/assets",
      entryNames: "[name]-[hash]",
      chunkNames: "[name]-[hash]",
      assetNames: "[name]-[hash]",
      bundle: true,
      // Pages loaded on demand (the terminal's xterm.js) are chunks of their own.
      splitting: true,
      format: "esm",
      platform: "browser",
      target: "es2022",
      minify: true,
      legalComments: "none",
      jsx: "automatic",
      jsxImportSource: "preact",
      write: false,
      logLevel: "silent",
    })
    const assets = new Map<string, Asset>()
    for (const file of result.outputFiles) {
      const name = file.path.slice(file.path.lastIndexOf("/") + 1)
      assets.set(name, { body: file.contents, contentType: typeOf(name) })
    }
    const names = [...assets.keys()]
    const script = names.find((n) => n.startsWith("app-") && n.endsWith(".js"))
    if (script === undefined) throw new ConsoleBuildError("the console bundle has no script")
    const style = names.find((n) => n.startsWith("app-") && n.endsWith(".css"))
    return { assets, html: page(script, style) }
  },
  catch: (e) =>
    e instanceof ConsoleBuildError ? e : new ConsoleBuildError(`console build failed: ${String(e)}`),
})

/** The assets, built on first use and kept (a failed build, a defect of the sources, is kept too). */
export const layer = Layer.effect(
  ConsoleAssets,
  Effect.map(Effect.cached(build), (built) => ({ built })),
)
