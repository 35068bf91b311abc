/**
 * Machine figures for the `namespace` driver (crun, unprivileged tenants), each beside the same
 * figure of the old bwrap driver measured in the same run (`bench/bwrap-baseline.ts`): create →
 * SSH ready over ~10 machines (p50/p95), the round trip of `bash true` over one open session
 * (p50/p99) beside a local `bash -c true`, a compile-heavy workload (byte-compiling part of Python's
 * standard library, CPU and many small writes), and a full host: 14 `s` machines (the default
 * 14-vCPU budget) created at once, each running `bash true`. Goals: ready p50 < 300 ms, exec p50 < 5 ms.
 * Then machine start by base (crun): the full bases (browser and display, built on first use)
 * beside the slim test base, and the first `screenshot` in each full machine, which starts its
 * display (lazily, so a run that never looks at the screen never pays for it). First, the start of the
 * driver's machine thread, once per process, apart from every machine's figure.
 *
 *   node --import tsx bench/machines.ts [machines=10] [execs=200] [together=14]
 */
import { spawnSync } from "node:child_process"
import { Effect } from "effect"
import { type Base, ensureFullBases, ensureTestBase } from "../host-agent/bases/Bases.ts"
import { connect } from "../host-agent/guest/GuestSession.ts"
import { type MachineDriverService, scopedOn } from "../host-agent/machines/MachineDriver.ts"
import { make } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { newKeys, testDriverSettings, testId } from "../host-agent/machines/namespace/testing.ts"
import { bwrapBaseline } from "./bwrap-baseline.ts"

const machines = Number(process.argv[2] ?? 10)
const execs = Number(process.argv[3] ?? 200)
const together = Number(process.argv[4] ?? 14)

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const ms = (n: number) => `${n.toFixed(2)} ms`

// Byte-compiles part of Python's standard library in place: CPU, and thousands of small files
// written through the root's overlay (copied up on first write).
const COMPILE = `set -e; cd "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
python3 -m compileall -q -f asyncio email json http xml logging unittest concurrent > /dev/null`

/** A machine on `base`, its session, and its first `bash true`; pushes the time that took to `into`. */
const readyOn = (
  driver: MachineDriverService,
  base: Base,
  keys: ReturnType<typeof newKeys>,
  label: string,
  into: Array<number>,
) =>
  Effect.gen(function* () {
    const t0 = performance.now()
    const machine = yield* scopedOn(driver, {
      id: testId(label),
      size: "s",
      base: base.rootfs,
      authorizedKey: keys.client.public,
      hostKey: keys.host.private,
    })
    const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
    yield* guest.bash({ command: "true" })
    into.push(performance.now() - t0)
    return guest
  })

const measure = (label: string, driver: MachineDriverService) =>
  Effect.gen(function* () {
    const base = yield* Effect.promise(() => ensureTestBase())
    const keys = newKeys()
    const ready: Array<number> = []
    const rtt: Array<number> = []
    const compile: Array<number> = []
    const readyMachine = (label: string, into: Array<number>) => readyOn(driver, base, keys, label, into)
    for (let i = 0; i < machines; i++) {
      yield* Effect.scoped(
        Effect.gen(function* () {
          const guest = yield* readyMachine(`bench${i}`, ready)
          if (i === 0) {
            for (let j = 0; j < execs; j++) {
              const t = performance.now()
              yield* guest.bash({ command: "true" })
              rtt.push(performance.now() - t)
            }
          }
          if (i < 3) {
            const t = performance.now()
            const r = yield* guest.bash({ command: COMPILE, timeout_ms: 600_000 })
            if (r.exit_code !== 0) return yield* Effect.die(new Error(`compile workload failed: ${r.output}`))
            compile.push(performance.now() - t)
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
          (i) => readyMachine(`full${i}`, each),
          { concurrency: "unbounded", discard: true },
        )
        // Measured before the scope closes, so destroying the machines is not counted.
        return performance.now() - t0
      }),
    )
    return { label, ready, rtt, compile, each, wall }
  })

// Create → SSH ready → first `bash true` on each base, one machine after another; on a full base,
// also the first `screenshot` (Xvfb, window manager and background started on demand).
const byBase = (driver: MachineDriverService, slim: Base, full: ReadonlyArray<Base>) =>
  Effect.forEach([slim, ...full], (base) =>
    Effect.gen(function* () {
      const keys = newKeys()
      const ready: Array<number> = []
      const shot: Array<number> = []
      for (let i = 0; i < machines; i++) {
        yield* Effect.scoped(
          Effect.gen(function* () {
            const guest = yield* readyOn(driver, base, keys, `base${i}`, ready)
            if (base === slim) return
            const t1 = performance.now()
            const r = yield* guest.bash({ command: "screenshot /tmp/screen.png" })
            if (r.exit_code !== 0) return yield* Effect.die(new Error(`screenshot failed: ${r.output}`))
            shot.push(performance.now() - t1)
          }),
        )
      }
      return { base, ready, shot }
    }),
  )

const program = Effect.gen(function* () {
  // The driver's machine thread starts once per process (the host agent starts it with its driver):
  // timed here on its own, by the removal of a machine never made, so no machine's figure has it.
  const crun = make(testDriverSettings)
  const t0 = performance.now()
  yield* Effect.either(crun.destroy(testId("never")))
  console.log(
    `machine thread start (once per process, the driver bundled and started): ${ms(performance.now() - t0)}`,
  )
  const rows = [
    yield* measure("crun (unprivileged tenant)", crun),
    yield* measure("bwrap (old driver, root on the host; baseline)", bwrapBaseline),
  ]
  const local: Array<number> = []
  for (let j = 0; j < execs; j++) {
    const t = performance.now()
    spawnSync("bash", ["-c", "true"])
    local.push(performance.now() - t)
  }
  for (const r of rows) {
    console.log(`— ${r.label}`)
    console.log(
      `create → SSH ready → first bash (${machines} machines): p50 ${ms(pct(r.ready, 50))}, p95 ${ms(pct(r.ready, 95))} (goal p50 < 300 ms)`,
    )
    console.log(
      `bash true over the open session (${execs}): p50 ${ms(pct(r.rtt, 50))}, p99 ${ms(pct(r.rtt, 99))} (goal p50 < 5 ms)`,
    )
    console.log(
      `compile workload (python compileall, ${r.compile.length} runs): p50 ${ms(pct(r.compile, 50))}`,
    )
    console.log(
      `${together} s machines at once → each ready: p50 ${ms(pct(r.each, 50))}, max ${ms(Math.max(...r.each))}; all ready in ${ms(r.wall)}`,
    )
    console.log(`ratio exec/local p50: ${(pct(r.rtt, 50) / pct(local, 50)).toFixed(2)}`)
  }
  console.log(`local bash -c true baseline (${execs}): p50 ${ms(pct(local, 50))}, p99 ${ms(pct(local, 99))}`)

  const slim = yield* Effect.promise(() => ensureTestBase())
  const full = yield* Effect.promise(() => ensureFullBases())
  console.log(`— machine start by base (crun, ${machines} machines each, one after another)`)
  for (const r of yield* byBase(make(testDriverSettings), slim, full)) {
    const label = r.base === slim ? `${r.base.name} (slim, test fixture)` : r.base.name
    console.log(
      `${label}: create → SSH ready → first bash p50 ${ms(pct(r.ready, 50))}, p95 ${ms(pct(r.ready, 95))}` +
        (r.shot.length > 0 ? `; first screenshot (starts the display) p50 ${ms(pct(r.shot, 50))}` : ""),
    )
  }
})

Effect.runPromise(program).catch((e) => {
  console.error(e)
  process.exit(1)
})
