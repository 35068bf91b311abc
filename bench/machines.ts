/**
 * Machine figures for the `namespace` driver: create → SSH ready over ~10 machines (p50/p95), the
 * round trip of `bash true` over one open session (p50/p99) beside a local `bash -c true`, and a
 * full host: 14 `s` machines (the default 14-vCPU budget) created at once, each running `bash true`.
 * Goals: ready p50 < 300 ms, exec p50 < 5 ms.
 *
 *   node --import tsx bench/machines.ts [machines=10] [execs=200] [together=14]
 */
import { spawnSync } from "node:child_process"
import { Effect } from "effect"
import { ensureTestBase } from "../host-agent/bases/Bases.ts"
import { connect } from "../host-agent/guest/GuestSession.ts"
import { scopedOn } from "../host-agent/machines/MachineDriver.ts"
import { make, NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { newKeys, testId } from "../host-agent/machines/namespace/testing.ts"

const machines = Number(process.argv[2] ?? 10)
const execs = Number(process.argv[3] ?? 200)
const together = Number(process.argv[4] ?? 14)

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const ms = (n: number) => `${n.toFixed(2)} ms`

const program = Effect.gen(function* () {
  const base = yield* Effect.promise(() => ensureTestBase())
  const driver = make(NamespaceDriverSettings.defaults)
  const keys = newKeys()
  const ready: Array<number> = []
  const rtt: Array<number> = []
  for (let i = 0; i < machines; i++) {
    yield* Effect.scoped(
      Effect.gen(function* () {
        const t0 = performance.now()
        const machine = yield* scopedOn(driver, {
          id: testId(`bench${i}`),
          size: "s",
          base: base.rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
        })
        const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
        yield* guest.bash({ command: "true" })
        ready.push(performance.now() - t0)
        if (i === 0) {
          for (let j = 0; j < execs; j++) {
            const t = performance.now()
            yield* guest.bash({ command: "true" })
            rtt.push(performance.now() - t)
          }
        }
      }),
    )
  }
  // A full host: every machine created at once; each one's own ready time and the wall time for all.
  const each: Array<number> = []
  const wall = yield* Effect.scoped(
    Effect.gen(function* () {
      const t0 = performance.now()
      yield* Effect.forEach(
        Array.from({ length: together }, (_, i) => i),
        (i) =>
          Effect.gen(function* () {
            const t = performance.now()
            const machine = yield* scopedOn(driver, {
              id: testId(`full${i}`),
              size: "s",
              base: base.rootfs,
              authorizedKey: keys.client.public,
              hostKey: keys.host.private,
            })
            const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
            yield* guest.bash({ command: "true" })
            each.push(performance.now() - t)
          }),
        { concurrency: "unbounded", discard: true },
      )
      // Measured before the scope closes, so destroying the machines is not counted.
      return performance.now() - t0
    }),
  )
  const local: Array<number> = []
  for (let j = 0; j < execs; j++) {
    const t = performance.now()
    spawnSync("bash", ["-c", "true"])
    local.push(performance.now() - t)
  }
  console.log(
    `create → SSH ready → first bash (${machines} machines): p50 ${ms(pct(ready, 50))}, p95 ${ms(pct(ready, 95))} (goal p50 < 300 ms)`,
  )
  console.log(
    `bash true over the open session (${execs}): p50 ${ms(pct(rtt, 50))}, p99 ${ms(pct(rtt, 99))} (goal p50 < 5 ms)`,
  )
  console.log(
    `${together} s machines at once → each ready: p50 ${ms(pct(each, 50))}, max ${ms(Math.max(...each))}; all ready in ${ms(wall)}`,
  )
  console.log(`local bash -c true baseline (${execs}): p50 ${ms(pct(local, 50))}, p99 ${ms(pct(local, 99))}`)
  console.log(`ratio exec/local p50: ${(pct(rtt, 50) / pct(local, 50)).toFixed(2)}`)
})

Effect.runPromise(program).catch((e) => {
  console.error(e)
  process.exit(1)
})
