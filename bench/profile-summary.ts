/**
 * Sums CPU profiles (`.cpuprofile`, as `bench/runs.ts` writes with `BENCH_CPU_PROFILE`) by where
 * the time was spent, self time only: an npm package, a file of this project, Node's own code,
 * garbage collection; then the functions with the most self time. With `per=<n>`, each figure is
 * also divided by n (say, the commands the profiles cover) to print milliseconds per command.
 * With `--callers=<place>` (say `effect`), the self time spent in that place is also summed by the
 * project file nearest it on the stack: which of our files spent it (a package's time is otherwise
 * spread over its own functions).
 *
 *   node --import tsx bench/profile-summary.ts [--per=<n>] [--top=<n>] [--callers=<place>] <file.cpuprofile> ...
 */
import { readFile } from "node:fs/promises"

interface ProfileNode {
  readonly id: number
  readonly children?: ReadonlyArray<number>
  readonly callFrame: {
    readonly functionName: string
    readonly url: string
    readonly lineNumber: number
  }
}
interface Profile {
  readonly nodes: ReadonlyArray<ProfileNode>
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}

const args = process.argv.slice(2)
const option = (name: string) => {
  const found = args.find((a) => a.startsWith(`--${name}=`))
  return found === undefined ? undefined : Number(found.slice(name.length + 3))
}
const per = option("per")
const top = option("top") ?? 25
const callersOf = args.find((a) => a.startsWith("--callers="))?.slice("--callers=".length)
const files = args.filter((a) => !a.startsWith("--"))

/** Where a frame's code is: a package, a project file, Node's own, or the VM's. */
const placeOf = (node: ProfileNode): string => {
  const { url, functionName } = node.callFrame
  if (url === "") return `(${functionName || "anonymous"})`
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)
  if (pkg) return pkg[1] as string
  if (url.startsWith("node:")) return "node:"
  const own = /\/work\/[^/]+\/(.*)$/.exec(url.replace(/^file:\/\//, ""))
  return own ? (own[1] as string) : url
}

/** Whether a frame's code is a file of this project (not a package's, Node's or the VM's). */
const isOwn = ({ callFrame: { url } }: ProfileNode) =>
  url !== "" && !url.startsWith("node:") && !url.includes("node_modules/")
const byPlace = new Map<string, number>()
const byFunction = new Map<string, number>()
const byCaller = new Map<string, number>()
let total = 0
for (const file of files) {
  const profile = JSON.parse(await readFile(file, "utf8")) as Profile
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]))
  const parents = new Map<number, ProfileNode>()
  for (const n of profile.nodes) for (const c of n.children ?? []) parents.set(c, n)
  // The project file nearest `node` on its stack.
  const callerOf = (node: ProfileNode) => {
    for (let n: ProfileNode | undefined = node; n !== undefined; n = parents.get(n.id))
      if (isOwn(n)) return placeOf(n)
    return "(none of ours)"
  }
  profile.samples.forEach((id, i) => {
    const node = nodes.get(id)
    const us = profile.timeDeltas[i] ?? 0
    if (!node) return
    const place = placeOf(node)
    if (place === "((idle))") return
    total += us
    byPlace.set(place, (byPlace.get(place) ?? 0) + us)
    const fn = `${node.callFrame.functionName || "(anonymous)"} ${place}:${node.callFrame.lineNumber + 1}`
    byFunction.set(fn, (byFunction.get(fn) ?? 0) + us)
    if (place === callersOf) {
      const caller = callerOf(node)
      byCaller.set(caller, (byCaller.get(caller) ?? 0) + us)
    }
  })
}

const row = (name: string, us: number) =>
  `${(us / 1000).toFixed(1).padStart(9)} ms ${((100 * us) / total).toFixed(1).padStart(5)} %${
    per === undefined ? "" : ` ${(us / 1000 / per).toFixed(3).padStart(7)} ms each`
  }  ${name}`
const sorted = (m: Map<string, number>) => [...m.entries()].sort((a, b) => b[1] - a[1])

console.log(row("busy in all (idle left out)", total))
console.log("by place:")
for (const [name, us] of sorted(byPlace).slice(0, top)) console.log(row(name, us))
console.log("by function:")
for (const [name, us] of sorted(byFunction).slice(0, top)) console.log(row(name, us))
if (callersOf !== undefined) {
  console.log(`${callersOf}, by the project file nearest it on the stack:`)
  for (const [name, us] of sorted(byCaller).slice(0, top)) console.log(row(name, us))
}
