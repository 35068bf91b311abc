/**
 * `npm run bench`: every benchmark, one after another, each in its own process so one's memory
 * and handles cannot colour the next. Each prints its own figures beside a baseline measured in
 * the same run; none asserts anything.
 *
 *   npm run bench                 all of them
 *   npm run bench -- seal gateway only the named ones
 */
import { spawnSync } from "node:child_process"
import { join } from "node:path"
import { root } from "../deploy/tools.mjs"

/** Name, script and default arguments; the qemu one boots emulated machines and is slow. */
const benches: ReadonlyArray<readonly [string, string, ReadonlyArray<string>]> = [
  ["seal", "seal.ts", ["256"]],
  ["gateway", "gateway.ts", ["6", "50"]],
  ["uploads", "uploads.ts", ["1024"]],
  ["actors", "actors.ts", []],
  ["machines", "machines.ts", ["10", "200"]],
  ["runs", "runs.ts", ["50", "200"]],
  ["queue", "queue.ts", ["8", "5"]],
  ["agent", "agent.ts", ["200"]],
  ["prompt-cache", "prompt-cache.ts", ["20"]],
  ["chaos", "chaos.ts", ["30", "18"]],
  ["chaos-cluster", "chaos.ts", ["cluster", "30", "18"]],
  ["output-pack", "output-pack.ts", ["128"]],
  ["cli", "cli.ts", ["20", "1024"]],
  ["qemu", "qemu.ts", ["1", "20", "auto"]],
]

const wanted = process.argv.slice(2)
const unknown = wanted.filter((w) => !benches.some(([name]) => name === w))
if (unknown.length > 0) {
  process.stderr.write(`unknown bench ${unknown.join(", ")}; known: ${benches.map(([n]) => n).join(", ")}\n`)
  process.exit(2)
}

let failed = 0
for (const [name, script, args] of benches) {
  if (wanted.length > 0 && !wanted.includes(name)) continue
  process.stdout.write(`\n=== bench ${name}\n`)
  const result = spawnSync(process.execPath, ["--import", "tsx", join(root, "bench", script), ...args], {
    stdio: "inherit",
    cwd: root,
  })
  if (result.status !== 0) {
    failed++
    process.stdout.write(`=== bench ${name} exited with ${result.status ?? result.signal}\n`)
  }
}
process.exit(failed === 0 ? 0 : 1)
