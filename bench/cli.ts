// The user CLI: (a) `hangar version` start-up, p50/p95 over N runs, beside `node -e 0` in the same
// run (and both again without `NODE_EXTRA_CA_CERTS` when it is set), and the operator commands'
// (`hangar admin` to its usage error); (b) `hangar run --in`'s upload, a generated folder (a few
// big random files) packed and sent by `uploadFolder`, beside the gateway's raw upload rate in the
// same run (POST /v1/files, then the PUT of the same archive bytes from a file, streamed by fetch).
// The two take turns, `rounds` times (this machine's speed drifts by more than their difference
// over a minute: one pair read 0.93 and the next 0.73); prints each round's rates and ratio, then
// the medians. The goal is the CLI at ≥ 80 % of raw. No assertions.
// Run: node --import tsx bench/cli.ts [runs, default 20] [MiB, default 1024] [rounds, default 3]
//
// The gateway is its own process (`gateway/uploads/testServer.ts` on a real nats-server), as in
// bench/uploads.ts; the folder lives under the system's temporary folder and is removed at the end.
import { spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { createReadStream } from "node:fs"
import { mkdir, mkdtemp, open, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Readable } from "node:stream"
import * as Api from "../cli/user/Api.ts"
import { packFolder, uploadFolder } from "../cli/user/Files.ts"
import type { Out } from "../cli/user/Print.ts"
import { root } from "../deploy/tools.mjs"
import { startChildGateway } from "../gateway/uploads/spawn.ts"
import { startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const MiB = 1024 * 1024
const runs = Number(process.argv[2] ?? 20)
const folderBytes = Number(process.argv[3] ?? 1024) * MiB
const rounds = Math.max(1, Number(process.argv[4] ?? 3))

const quantile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] ?? Number.NaN

const timedSpawn = (args: ReadonlyArray<string>, status = 0, env = process.env): number => {
  const start = process.hrtime.bigint()
  const r = spawnSync(process.execPath, args, { cwd: root, env, stdio: ["ignore", "ignore", "pipe"] })
  const ms = Number(process.hrtime.bigint() - start) / 1e6
  if (r.status !== status) throw new Error(`${args.join(" ")} exited ${r.status}: ${r.stderr}`)
  return ms
}

const startup = (label: string, args: ReadonlyArray<string>, status = 0, env = process.env) => {
  timedSpawn(args, status, env) // warm: the CLI bundles itself on its first start after a change
  const times = Array.from({ length: runs }, () => timedSpawn(args, status, env)).sort((a, b) => a - b)
  const p50 = quantile(times, 0.5)
  const p95 = quantile(times, 0.95)
  console.log(
    `${label.padEnd(28)} p50 ${p50.toFixed(0).padStart(5)} ms   p95 ${p95.toFixed(0).padStart(5)} ms`,
  )
  return { p50, p95 }
}

console.log(`start-up over ${runs} runs`)
const bare = startup("node -e 0", ["-e", "0"])
const version = startup("hangar version", [join(root, "cli", "bin.cjs"), "version"])
console.log(`hangar version over node: +${(version.p50 - bare.p50).toFixed(0)} ms at p50`)
// `NODE_EXTRA_CA_CERTS` (set on some machines, this one among them) makes every node process read
// and parse that whole bundle before its first line of JavaScript: both rows again without it.
if (process.env.NODE_EXTRA_CA_CERTS !== undefined) {
  const { NODE_EXTRA_CA_CERTS: _, ...plain } = process.env
  const bareNo = startup("node -e 0, no extra CAs", ["-e", "0"], 0, plain)
  const versionNo = startup(
    "hangar version, no extra CAs",
    [join(root, "cli", "bin.cjs"), "version"],
    0,
    plain,
  )
  console.log(
    `NODE_EXTRA_CA_CERTS costs every start ${(bare.p50 - bareNo.p50).toFixed(0)} ms here; hangar version over node without it: +${(versionNo.p50 - bareNo.p50).toFixed(0)} ms at p50`,
  )
}
// The operator commands load effect and the NATS client (bundled in, no tsx): to their usage error,
// which comes after every module is loaded and before any connection.
const admin = startup("hangar admin (usage, exit 2)", [join(root, "cli", "bin.cjs"), "admin"], 2)
console.log(`hangar admin over node: +${(admin.p50 - bare.p50).toFixed(0)} ms at p50`)

// ---------------------------------------------------------------------------------------------
// The upload.

const timed = async <A>(run: () => Promise<A>): Promise<[A, number]> => {
  const start = process.hrtime.bigint()
  const a = await run()
  return [a, Number(process.hrtime.bigint() - start) / 1e9]
}

const quiet: Out = { json: false, tty: false, color: false }
const work = await mkdtemp(join(tmpdir(), "hangar-bench-cli-"))
await mkdir(join(work, "gateway"))
const nats = await startNatsServer()
const gateway = await startChildGateway({
  natsUrl: nats.url,
  prefix: uniquePrefix(),
  dir: join(work, "gateway"),
})
try {
  // The folder: four big random files, one in a nested folder.
  const folder = join(work, "folder")
  await mkdir(join(folder, "nested"), { recursive: true })
  const pool = randomBytes(8 * MiB)
  const files = 4
  for (let i = 0; i < files; i++) {
    const f = await open(join(folder, i === 0 ? "nested/part-0.bin" : `part-${i}.bin`), "w")
    for (let left = folderBytes / files; left > 0; left -= pool.length) {
      // Fresh bytes every piece: the pool with its first 16 bytes changed does not compress.
      randomBytes(16).copy(pool)
      pool.writeBigUInt64BE(BigInt(left), 16)
      await f.write(pool.subarray(0, Math.min(left, pool.length)))
    }
    await f.close()
  }

  // The same bytes the CLI will send, made ahead, for the raw upload.
  const archive = join(work, "folder.tar.gz")
  const [counted, packSeconds] = await timed(() => packFolder(folder, archive))
  const bytes = (await stat(archive)).size
  if (bytes !== counted.bytes) throw new Error("the archive's size is not the one counted")
  console.log(
    `\nfolder ${(folderBytes / MiB).toFixed(0)} MiB in ${files} files; archive ${(bytes / 1e6).toFixed(0)} MB`,
  )
  const mbs = (seconds: number) => bytes / 1e6 / seconds
  console.log(
    `${"pack only (tar + gzip -1 + sha256)".padEnd(44)} ${mbs(packSeconds).toFixed(0).padStart(6)} MB/s  (${packSeconds.toFixed(2)} s)`,
  )

  // Resident memory of this process while `run` works: before, and the peak.
  const sampled = async <A>(run: () => Promise<A>): Promise<[A, number, string]> => {
    const before = process.memoryUsage().rss
    let peak = before
    const sampler = setInterval(() => {
      peak = Math.max(peak, process.memoryUsage().rss)
    }, 50)
    try {
      const [a, seconds] = await timed(run)
      return [a, seconds, `RSS ${(before / MiB).toFixed(0)} MiB before, peak ${(peak / MiB).toFixed(0)} MiB`]
    } finally {
      clearInterval(sampler)
    }
  }

  const api = Api.make({ SERVICE_API: gateway.url, SERVICE_KEY: gateway.token })
  const cliUpload = async () => {
    const id = await uploadFolder(api, quiet, folder)
    if (!id.startsWith("file_")) throw new Error(`uploadFolder answered ${id}`)
  }
  const headers = { authorization: `Bearer ${gateway.token}`, "content-type": "application/json" }
  const rawUpload = async () => {
    const made = await fetch(`${gateway.url}/v1/files`, {
      method: "POST",
      headers,
      body: JSON.stringify({ bytes, sha256: counted.sha256 }),
    })
    const link = (await made.json()) as { url: string; method: string; headers: Record<string, string> }
    // Chunked at 1e9 bytes or more, as the CLI sends (the gateway's uWS refuses ten digits).
    const put = { ...link.headers }
    if (bytes >= 1e9) delete put["content-length"]
    const res = await fetch(link.url, {
      method: link.method,
      headers: put,
      body: Readable.toWeb(createReadStream(archive, { highWaterMark: MiB })) as ReadableStream,
      duplex: "half",
    } as RequestInit)
    if (res.status !== 200) throw new Error(`raw PUT answered ${res.status} ${await res.text()}`)
  }

  const row = (label: string, rate: number, seconds: number, rss = "") =>
    console.log(
      `${label.padEnd(44)} ${rate.toFixed(0).padStart(6)} MB/s  (${seconds.toFixed(2)} s)${rss === "" ? "" : `  ${rss}`}`,
    )
  const median = (xs: ReadonlyArray<number>) =>
    quantile(
      [...xs].sort((a, b) => a - b),
      0.5,
    )
  const cliRates: Array<number> = []
  const rawRates: Array<number> = []
  const ratios: Array<number> = []
  for (let round = 1; round <= rounds; round++) {
    // The CLI first, so its memory (printed for the first round) is not coloured by the raw upload's.
    const [, cliSeconds, cliRss] = await sampled(cliUpload)
    const [, rawSeconds, rawRss] = await sampled(rawUpload)
    const [cli, raw] = [mbs(cliSeconds), mbs(rawSeconds)]
    cliRates.push(cli)
    rawRates.push(raw)
    ratios.push(cli / raw)
    console.log(`round ${round} of ${rounds}`)
    row("raw: POST /v1/files + fetch PUT from a file", raw, rawSeconds, round === 1 ? rawRss : "")
    row("CLI: uploadFolder (pack, then upload)", cli, cliSeconds, round === 1 ? cliRss : "")
    console.log(`CLI / raw: ${(cli / raw).toFixed(3)}`)
  }
  await rm(archive)
  console.log(
    `median of ${rounds} rounds: raw ${median(rawRates).toFixed(0)} MB/s, CLI ${median(cliRates).toFixed(0)} MB/s; CLI / raw: ${median(ratios).toFixed(3)}   (goal ≥ 0.80)`,
  )
} finally {
  await gateway.stop()
  await nats.stop()
  await rm(work, { recursive: true, force: true })
}
