/**
 * Machine figures for the `qemu` driver: the KVM probe's answer and time, create → first `bash`
 * answered over a few machines (p50/max), destroy time, and the round trip of `bash true` over one
 * open session (p50/p99). The accelerator is `auto` (KVM where the kernel boots on it, else TCG)
 * unless given.
 *
 *   node --import tsx bench/qemu.ts [machines=3] [execs=50] [auto|kvm|tcg]
 */
import { Effect } from "effect"
import { ensureTestBase } from "../host-agent/bases/Bases.ts"
import { connect } from "../host-agent/guest/GuestSession.ts"
import { newKeys, testId } from "../host-agent/machines/namespace/testing.ts"
import { make, QemuDriverSettings } from "../host-agent/machines/qemu/QemuDriver.ts"

const machines = Number(process.argv[2] ?? 3)
const execs = Number(process.argv[3] ?? 50)
const accel = (process.argv[4] ?? "auto") as "auto" | "kvm" | "tcg"

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const ms = (n: number) => `${n.toFixed(1)} ms`

const program = Effect.gen(function* () {
  const base = yield* Effect.promise(() => ensureTestBase())
  const driver = make({ ...QemuDriverSettings.defaults, accel, readyTimeoutMs: 240_000 })
  const keys = newKeys()
  const ready: Array<number> = []
  const destroy: Array<number> = []
  const rtt: Array<number> = []
  let chosen = ""
  for (let i = 0; i < machines; i++) {
    const t0 = performance.now()
    const machine = yield* driver.create({
      id: testId(`qbench${i}`),
      size: "s",
      base: base.rootfs,
      authorizedKey: keys.client.public,
      hostKey: keys.host.private,
    })
    yield* Effect.scoped(
      Effect.gen(function* () {
        const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
        yield* guest.bash({ command: "true" })
        ready.push(performance.now() - t0)
        chosen = `${machine.handle.accel} (${machine.handle.accelDetail})`
        if (i === 0) {
          for (let j = 0; j < execs; j++) {
            const t = performance.now()
            yield* guest.bash({ command: "true" })
            rtt.push(performance.now() - t)
          }
        }
      }),
    ).pipe(Effect.onError(() => Effect.orDie(driver.destroy(machine.id))))
    const t1 = performance.now()
    yield* driver.destroy(machine.id)
    destroy.push(performance.now() - t1)
  }
  const lines = [
    `accelerator            ${chosen}`,
    `create → bash answered p50 ${ms(pct(ready, 50))}  max ${ms(Math.max(...ready))}  (n=${machines}; the first includes the probe when auto)`,
    `destroy                p50 ${ms(pct(destroy, 50))}  max ${ms(Math.max(...destroy))}`,
    `bash true round trip    p50 ${ms(pct(rtt, 50))}  p99 ${ms(pct(rtt, 99))}  (n=${execs})`,
  ]
  yield* Effect.sync(() => process.stdout.write(`${lines.join("\n")}\n`))
})

Effect.runPromise(program).catch((e) => {
  process.stderr.write(`${String(e)}\n`)
  process.exit(1)
})
