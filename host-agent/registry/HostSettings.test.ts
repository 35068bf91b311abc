import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { HostId } from "../../schema/Host.ts"
import { derivedId, HostSettings, reserveMib, resolve } from "./HostSettings.ts"

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-host-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

describe("HostSettings", () => {
  it("the derived id is a valid host id, stable for one machine and folder, different for another folder", () => {
    const a = derivedId("3d1219c7c4c5404aaa1f6d2a48adfda4\n", "/srv/a/.data")
    expect(Schema.is(HostId)(a)).toBe(true)
    expect(a).toMatch(/^host_[0-9a-hjkmnp-tv-z]{26}$/)
    expect(derivedId("3d1219c7c4c5404aaa1f6d2a48adfda4", "/srv/a/.data")).toBe(a)
    expect(derivedId("3d1219c7c4c5404aaa1f6d2a48adfda4", "/srv/b/.data")).not.toBe(a)
  })

  it.scoped(
    "defaults resolve from the machine: id from machine id + data dir, 14 vCPUs, memory minus reserve",
    () =>
      Effect.gen(function* () {
        const dir = yield* tempDir
        yield* Effect.promise(() => writeFile(join(dir, "machine-id"), "0123abcd\n"))
        const host = yield* resolve({
          ...HostSettings.defaults,
          machineIdPath: join(dir, "machine-id"),
          dataDir: "/x/.data",
        })
        expect(host.id).toBe(derivedId("0123abcd", "/x/.data"))
        expect(host.vcpus).toBe(14)
        expect(host.driver).toBe("namespace")
        expect(host.memoryMib).toBeGreaterThan(0)
        expect(reserveMib(24_000)).toBe(3000)
        expect(reserveMib(4000)).toBe(1024)
      }),
  )

  it.effect("explicit settings win; a malformed HANGAR_HOST_ID is refused with HostIdInvalid", () =>
    Effect.gen(function* () {
      const host = yield* resolve({ ...HostSettings.defaults, id: "h1", memoryMib: 4096, driver: "qemu" })
      expect(host).toEqual({ id: "h1", driver: "qemu", vcpus: 14, memoryMib: 4096 })
      const bad = yield* resolve({ ...HostSettings.defaults, id: "Bad.Id" }).pipe(Effect.flip)
      expect(bad).toMatchObject({ _tag: "HostIdInvalid", id: "Bad.Id" })
    }),
  )
})
