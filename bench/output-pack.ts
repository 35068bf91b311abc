// Where to gzip a run's output (host-agent/guest/Outputs.ts): `gzip -1` in the guest or zlib level 1
// in the host agent, as figures (no assertions). Run: node --import tsx bench/output-pack.ts [MiB, default 128]
//
// A size `s` machine (1 vCPU) gets an output of half text (seq), half random bytes; each way packs it
// into a real object store (sealed) three times, alternating, and prints seconds, MiB/s and archive size.
import { Effect } from "effect"
import { type Compressor, pack } from "../host-agent/guest/Outputs.ts"
import { store, testGuest } from "../host-agent/guest/testing.ts"
import { storageRuntime } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"

const MIB = 1024 * 1024
const total = Number(process.argv[2] ?? 128)
const t = await testGuest("bench", { diskBytes: 4 * total * MIB + 256 * MIB })
const runtime = storageRuntime()
try {
  const half = Math.floor(total / 2)
  await Effect.runPromise(
    t.guest.bash({
      command: `mkdir -p /workspace/out && seq 1 100000000 | head -c ${half * MIB} > /workspace/out/text && head -c ${(total - half) * MIB} /dev/urandom > /workspace/out/random`,
    }),
  )
  const run = (compressor: Compressor) =>
    runtime.runPromise(
      Effect.gen(function* () {
        const outputs = yield* store("outputs")
        const name = uniqueName("bench")
        const start = performance.now()
        const packed = yield* pack(
          t.guest,
          { store: outputs, account: "acc_0000000000000000000000000a", name },
          { compressor },
        )
        const seconds = (performance.now() - start) / 1000
        yield* outputs.delete(name)
        return { seconds, bytes: packed.bytes }
      }),
    )
  const cpu0 = process.cpuUsage()
  const results: Record<Compressor, Array<{ seconds: number; bytes: number; hostCpu: number }>> = {
    guest: [],
    host: [],
  }
  for (let i = 0; i < 3; i++) {
    for (const c of ["guest", "host"] as const) {
      const before = process.cpuUsage()
      const r = await run(c)
      const used = process.cpuUsage(before)
      results[c].push({ ...r, hostCpu: (used.user + used.system) / 1e6 })
    }
  }
  void cpu0
  for (const c of ["guest", "host"] as const) {
    const best = results[c].reduce((a, b) => (a.seconds < b.seconds ? a : b))
    console.log(
      `${c.padEnd(5)} gzip: best ${best.seconds.toFixed(2)} s, ${(total / best.seconds).toFixed(1)} MiB/s of output, archive ${(best.bytes / MIB).toFixed(1)} MiB, host agent CPU ${best.hostCpu.toFixed(2)} s`,
    )
  }
} finally {
  await runtime.dispose()
  console.log("leftovers:", await t.close())
}
