import { stat } from "node:fs/promises"
import { createServer } from "node:net"
import { Effect, Exit } from "effect"
import { beforeAll, expect, it } from "vitest"
import { type Base, ensureTestBase } from "../../bases/Bases.ts"
import { connect } from "../../guest/GuestSession.ts"
import { run } from "../namespace/exec.ts"
import { newKeys, testId } from "../namespace/testing.ts"
import * as Disks from "./Disks.ts"
import { make, QemuDriverSettings } from "./QemuDriver.ts"
import { leftovers } from "./testing.ts"

// TCG, so the test runs on any host; a smaller memory keeps the emulated boot quick.
const keys = newKeys()
const MiB = 1024 ** 2
const settings = { ...QemuDriverSettings.defaults, accel: "tcg" as const, readyTimeoutMs: 240_000 }
let base: Base
let baseImage: string

const stamp = async (path: string) => {
  const s = await stat(path)
  return { size: s.size, mtimeMs: s.mtimeMs, ctimeMs: s.ctimeMs }
}

beforeAll(async () => {
  base = await ensureTestBase()
  baseImage = await Disks.baseImage(settings.cacheDir, base.rootfs, settings.rootHeadroomBytes)
}, 15 * 60_000)

// Whether host interface `iface` exists.
const linkExists = (iface: string) =>
  run("ip", ["link", "show", iface]).then(
    () => true,
    () => false,
  )

it("boots a machine on its tap network whose sshd runs commands and files on its workspace disk, and removes every trace of it", async () => {
  const id = testId("qemu")
  const spec = {
    id,
    size: "s" as const,
    base: base.rootfs,
    authorizedKey: keys.client.public,
    hostKey: keys.host.private,
    override: { memoryBytes: 512 * MiB, diskBytes: 256 * MiB },
  }
  const driver = make(settings)
  const imageBefore = await stamp(baseImage)
  // The machine is destroyed however the checks end; a second destroy below must then find nothing.
  const machine = await Effect.runPromise(driver.create(spec))
  await Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        expect(machine.handle.accel).toBe("tcg")
        expect(machine.handle.dir).toContain(id)
        // Reached on its own address over its tap, as the host agent reaches a namespace machine.
        expect(machine.handle.network).toBe("tap")
        expect(machine.ssh).toMatchObject({ host: machine.handle.address, port: 22 })
        expect(yield* Effect.promise(() => linkExists(String(machine.handle.iface)))).toBe(true)
        const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
        const echo = yield* guest.bash({ command: "echo hello from $(hostname)" })
        expect(echo).toMatchObject({ exit_code: 0, output: "hello from machine\n", oom_killed: false })

        // The size's limits reach the guest: vCPUs, memory, and a /workspace disk of the capacity.
        const limits = yield* guest.bash({
          command:
            "nproc; awk '/MemTotal/{print $2 * 1024}' /proc/meminfo; blockdev --getsize64 $(findmnt -no SOURCE /workspace)",
        })
        const [vcpus, memory, disk] = limits.output.trim().split("\n").map(Number)
        expect(vcpus).toBe(1)
        expect(memory).toBeGreaterThan(400 * MiB)
        expect(memory).toBeLessThanOrEqual(512 * MiB)
        expect(disk).toBe(256 * MiB)

        expect(yield* guest.write({ file_path: "notes/a.txt", content: "one\ntwo\n" })).toEqual({ bytes: 8 })
        expect(yield* guest.read({ file_path: "/workspace/notes/a.txt" })).toEqual({ output: "one\ntwo\n" })

        // The host's policy applies to the tap: a listener on the host's side of it is not reachable
        // from the machine (a machine never reaches the host), while the host reaches the guest.
        const listener = createServer((socket) => socket.end("hello\n"))
        const hostAddress = String(machine.handle.hostAddress)
        yield* Effect.promise(() => new Promise<void>((ok) => listener.listen(0, hostAddress, ok)))
        const port = (listener.address() as { port: number }).port
        const out = yield* guest.bash({
          command: `(timeout 5 bash -c 'echo > /dev/tcp/${hostAddress}/${port}') 2>/dev/null && echo open || echo closed`,
        })
        yield* Effect.promise(() => new Promise<void>((ok) => listener.close(() => ok())))
        expect(out.output).toBe("closed\n")

        // Filling the machine's memory kills the command that did it, reported as such; sshd lives.
        const oom = yield* guest.bash({
          command: "python3 -c 'a = []\nwhile True: a.append(b\"x\" * (32 << 20))'",
        })
        expect(oom).toMatchObject({ oom_killed: true, exit_code: 137 })

        // The id is taken while the machine lives; the attempt changes nothing.
        const again = yield* Effect.exit(driver.create(spec))
        expect(Exit.isFailure(again) && JSON.stringify(again.cause)).toContain('"step":"folder"')
        expect((yield* guest.bash({ command: "echo still up" })).output).toBe("still up\n")
      }),
    ).pipe(Effect.ensuring(Effect.orDie(driver.destroy(id)))),
  )
  expect(await leftovers(id)).toEqual([])
  expect(await linkExists(String(machine.handle.iface))).toBe(false)
  // Idempotent: a second destroy finds nothing and succeeds.
  await Effect.runPromise(driver.destroy(id))
  expect(await leftovers(id)).toEqual([])
  // The machine wrote to its root disk (its keys in /etc/ssh), yet the shared base image was never touched.
  expect(await stamp(baseImage)).toEqual(imageBefore)
}, 300_000)

it("on QEMU's user network, only the forwarded SSH port reaches a machine and it reaches nothing", async () => {
  const id = testId("qemuuser")
  const driver = make({ ...settings, network: "user" })
  const machine = await Effect.runPromise(
    driver.create({
      id,
      size: "s",
      base: base.rootfs,
      authorizedKey: keys.client.public,
      hostKey: keys.host.private,
      override: { memoryBytes: 512 * MiB, diskBytes: 256 * MiB },
    }),
  )
  await Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        expect(machine.ssh.host).toBe("127.0.0.1")
        const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
        // 10.0.2.2 is the host as QEMU's user network shows it; `restrict=on` lets nothing out.
        const out = yield* guest.bash({
          command: `(timeout 5 bash -c 'echo > /dev/tcp/10.0.2.2/${machine.ssh.port}') 2>/dev/null && echo open || echo closed`,
        })
        expect(out.output).toBe("closed\n")
      }),
    ).pipe(Effect.ensuring(Effect.orDie(driver.destroy(id)))),
  )
  expect(await leftovers(id)).toEqual([])
}, 300_000)
