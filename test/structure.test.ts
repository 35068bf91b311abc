/**
 * The import rules of ARCHITECTURE.md, checked on every source file:
 *
 * - `schema/` (the contract, actor protocols included) imports only `schema/`;
 * - `core/` (shared infrastructure, the actor runtime included) imports `core/` and `schema/`;
 * - a role (`gateway/`, `actors/`, `host-agent/`, `relay/`) imports itself, `core/` and `schema/`,
 *   never another role and never `deploy/`;
 * - `@nats-io/*` is imported by `core/` only, `uWebSockets.js` by the gateway and the relay, `ssh2`
 *   by the host agent;
 * - the user CLI (`cli/user/`) reaches the service over HTTP and WebSocket only: it imports itself,
 *   and of the service only `core/Terminal.ts` (the terminal codec) and `core/KeyTokens.ts`
 *   (node:crypto alone), and of packages only `ws`, `yaml` and `tar` (it is bundled to start fast);
 * - `cli/`, `deploy/`, `bench/` and `test/` compose roles and may import anything, as may tests
 *   (`*.test.ts`) and test helpers (`testing.ts`, `testing/`), which build fixtures from the roles
 *   they exercise.
 */
import { readdirSync, readFileSync } from "node:fs"
import { dirname, join, normalize } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"

const root = fileURLToPath(new URL("..", import.meta.url))
const roles = new Set(["gateway", "actors", "host-agent", "relay"])
const composers = new Set(["cli", "deploy", "bench", "test"])
const packages: ReadonlyArray<readonly [RegExp, ReadonlySet<string>]> = [
  [/^@nats-io\//, new Set(["core"])],
  [/^uWebSockets\.js$/, new Set(["gateway", "relay"])],
  [/^ssh2$/, new Set(["host-agent"])],
]

const sources = (dir: string): Array<string> =>
  readdirSync(join(root, dir), { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name)
    if (e.isDirectory())
      return [".git", "node_modules", ".tools", ".data"].includes(e.name) ? [] : sources(path)
    return /\.(ts|mts|mjs)$/.test(e.name) ? [path] : []
  })

const areaOf = (path: string) => path.split("/")[0] ?? ""
const isTestCode = (path: string) => /\.test\.ts$/.test(path) || /(^|\/)testing(\.ts|\/)/.test(path)

const userCli = "cli/user/"
const userCliCore = new Set(["core/Terminal.ts", "core/KeyTokens.ts"])
const userCliPackages = /^(node:.*|ws|yaml|tar|esbuild)$/

/** What `path` may import from `target` (a repository path), or why not. */
const refusal = (path: string, target: string): string | undefined => {
  if (path.startsWith(userCli) && !isTestCode(path))
    return target.startsWith(userCli) || userCliCore.has(target)
      ? undefined
      : "the user CLI imports only cli/user/, core/Terminal.ts and core/KeyTokens.ts"
  const from = areaOf(path)
  const to = areaOf(target)
  if (from === to || composers.has(from) || isTestCode(path)) return undefined
  if (from === "schema") return "schema/ imports only schema/"
  if (to === "schema") return undefined
  if (from === "core") return to === "core" ? undefined : "core/ imports only core/ and schema/"
  if (roles.has(from))
    return to === "core" ? undefined : `a role imports only itself, core/ and schema/ (not ${to}/)`
  return undefined
}

const importsOf = (text: string) =>
  [
    ...text.matchAll(
      /(?:^|[\s;])(?:import|export)\b[^"'`]*?\bfrom\s*["']([^"']+)["']|\bimport\s*\(\s*["']([^"']+)["']\s*\)|^\s*import\s*["']([^"']+)["']/gm,
    ),
  ].map((m) => m[1] ?? m[2] ?? m[3] ?? "")

/** Every import that breaks a rule, as `file → specifier: rule`. */
const violations = (files: ReadonlyArray<string>, read: (path: string) => string) =>
  files.flatMap((path) =>
    importsOf(read(path)).flatMap((spec) => {
      if (spec.startsWith(".")) {
        const target = normalize(join(dirname(path), spec))
        const why = refusal(path, target)
        return why === undefined ? [] : [`${path} → ${spec}: ${why}`]
      }
      if (path.startsWith(userCli) && !isTestCode(path))
        return userCliPackages.test(spec)
          ? []
          : [`${path} → ${spec}: the user CLI imports only ws, yaml and tar`]
      if (isTestCode(path) || composers.has(areaOf(path))) return []
      for (const [pattern, allowed] of packages)
        if (pattern.test(spec) && !allowed.has(areaOf(path)))
          return [`${path} → ${spec}: only ${[...allowed].join(", ")} may import it`]
      return []
    }),
  )

describe("import rules", () => {
  it("hold for every source file of the repository", () => {
    const files = ["schema", "core", ...roles, ...composers].flatMap((d) => {
      try {
        return sources(d)
      } catch {
        return []
      }
    })
    expect(files.length).toBeGreaterThan(200)
    expect(violations(files, (p) => readFileSync(join(root, p), "utf8"))).toEqual([])
  })

  it("catch a role importing another role, core importing deploy, schema importing core, and a package out of place", () => {
    const fake: Record<string, string> = {
      "gateway/runs/Start.ts":
        'import { Run } from "../../actors/run/Run.ts"\nimport { x } from "../../core/Nats.ts"',
      "core/Links.ts": 'import { dataDir } from "../deploy/tools.mjs"',
      "schema/actors/Run.ts": 'import type { Nats } from "../../core/Nats.ts"',
      "host-agent/guest/Files.ts":
        'import { connect } from "@nats-io/transport-node"\nimport ssh2 from "ssh2"',
      "actors/run/Run.test.ts": 'import { x } from "../../gateway/Server.ts"',
      "cli/main.ts": 'import * as Actors from "../actors/main.ts"',
      "relay/Relay.ts": 'const m = await import("../host-agent/main.ts")',
      "cli/user/commands/runs.ts":
        'import { Effect } from "effect"\nimport { x } from "../../../core/Nats.ts"',
    }
    expect(violations(Object.keys(fake), (p) => fake[p] ?? "")).toEqual([
      "gateway/runs/Start.ts → ../../actors/run/Run.ts: a role imports only itself, core/ and schema/ (not actors/)",
      "core/Links.ts → ../deploy/tools.mjs: core/ imports only core/ and schema/",
      "schema/actors/Run.ts → ../../core/Nats.ts: schema/ imports only schema/",
      "host-agent/guest/Files.ts → @nats-io/transport-node: only core may import it",
      "relay/Relay.ts → ../host-agent/main.ts: a role imports only itself, core/ and schema/ (not host-agent/)",
      "cli/user/commands/runs.ts → effect: the user CLI imports only ws, yaml and tar",
      "cli/user/commands/runs.ts → ../../../core/Nats.ts: the user CLI imports only cli/user/, core/Terminal.ts and core/KeyTokens.ts",
    ])
  })
})
