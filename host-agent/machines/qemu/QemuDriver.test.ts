import { mkdtemp, readFile, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit } from "effect"
import { afterAll, expect, it } from "vitest"
import { run } from "../namespace/exec.ts"
import { newKeys, testId } from "../namespace/testing.ts"
import { probe } from "./Accel.ts"
import { newc } from "./Cpio.ts"
import { configArchive, initScript, netArgs, userNet } from "./Init.ts"
import { make, QemuDriverSettings } from "./QemuDriver.ts"
import { leftovers } from "./testing.ts"

const temps: Array<string> = []
const temp = async () => {
  const dir = await mkdtemp(join(tmpdir(), "hangar-qemu-"))
  temps.push(dir)
  return dir
}
afterAll(async () => {
  for (const dir of temps) await rm(dir, { recursive: true, force: true })
})

const unpack = async (archive: Buffer) => {
  const dir = await temp()
  await run("sh", ["-c", 'cd "$1" && busybox cpio -i -d', "sh", dir], { input: archive.toString("latin1") })
  return dir
}

it("writes newc archives that cpio unpacks with their folders, contents, modes and links", async () => {
  const dir = await unpack(
    newc([
      { type: "dir", path: "etc" },
      { type: "file", path: "etc/a", data: Buffer.from("abc"), mode: 0o600 },
      { type: "file", path: "etc/empty", data: new Uint8Array() },
      { type: "symlink", path: "etc/b", target: "a" },
    ]),
  )
  expect(await readFile(join(dir, "etc/a"), "utf8")).toBe("abc")
  expect((await stat(join(dir, "etc/a"))).mode & 0o777).toBe(0o600)
  expect(await readFile(join(dir, "etc/empty"), "utf8")).toBe("")
  expect(await readFile(join(dir, "etc/b"), "utf8")).toBe("abc")
})

it("puts the machine's keys and sshd config in its archive, the host key readable by root only", async () => {
  const keys = newKeys()
  const dir = await unpack(configArchive(keys.host.private, `${keys.client.public}\n\n`, "10.213.0.6"))
  expect(await readFile(join(dir, "hangar/host_key"), "utf8")).toBe(keys.host.private)
  expect((await stat(join(dir, "hangar/host_key"))).mode & 0o777).toBe(0o600)
  expect(await readFile(join(dir, "hangar/authorized_keys"), "utf8")).toBe(`${keys.client.public}\n`)
  const sshd = await readFile(join(dir, "hangar/sshd_config"), "utf8")
  expect(sshd).toContain("PasswordAuthentication no")
  expect(sshd).toContain("ListenAddress 10.213.0.6")
})

it("gives the guest its network on the kernel command line, which the init reads", () => {
  const args = netArgs({ address: "10.213.0.6", prefix: 30, gateway: "10.213.0.5" })
  expect(args).toEqual(["hangar.ip=10.213.0.6/30", "hangar.gw=10.213.0.5"])
  expect(netArgs(userNet)).toEqual(["hangar.ip=10.0.2.15/24", "hangar.gw=10.0.2.2"])
  expect(initScript).toContain(`hangar.ip=*) ip_cidr=\${w#hangar.ip=}`)
  expect(initScript).toContain("ip addr add $ip_cidr dev eth0 && ip route add default via $gw")
})

it("chooses TCG without starting QEMU when the KVM device is missing", async () => {
  const kernel = { vmlinuz: "/nonexistent", initrd: "/nonexistent", package: "none" }
  const result = await probe("/nonexistent/qemu", kernel, "/nonexistent/kvm", 60_000)
  expect(result).toEqual({ accel: "tcg", detail: "/nonexistent/kvm is not usable" })
})

it("refuses a bad machine id before making anything, and destroying an unknown machine succeeds twice", async () => {
  const machinesDir = await temp()
  const driver = make({ ...QemuDriverSettings.defaults, machinesDir, accel: "tcg" })
  const keys = newKeys()
  const spec = {
    size: "s" as const,
    base: "/nonexistent",
    authorizedKey: keys.client.public,
    hostKey: keys.host.private,
  }
  // 64 characters is the longest id; 65 is one too many.
  const exit = await Effect.runPromiseExit(driver.create({ ...spec, id: "a".repeat(65) }))
  expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain('"step":"folder"')
  expect(await leftovers("a".repeat(65), machinesDir)).toEqual([])

  // A valid id with a bad host key fails at the ssh step and leaves nothing behind.
  const id = testId("bad")
  const bad = await Effect.runPromiseExit(
    driver.create({ ...spec, id: "a".repeat(64), hostKey: "not a key" }),
  )
  expect(Exit.isFailure(bad) && JSON.stringify(bad.cause)).toContain('"step":"ssh"')
  expect(await leftovers("a".repeat(64), machinesDir)).toEqual([])

  await Effect.runPromise(driver.destroy(id))
  await Effect.runPromise(driver.destroy(id))
  expect(await leftovers(id, machinesDir)).toEqual([])
})
