/** Helpers for tests of the guest's run-level work: one real machine and session, real storage. */
import { Effect, Exit, Scope } from "effect"
import * as ObjectStore from "../../core/ObjectStore.ts"
import { Storage } from "../../core/Storage.ts"
import { ensureTestBase } from "../bases/Bases.ts"
import { type Machine, type Size, scopedOn } from "../machines/MachineDriver.ts"
import { make, type NamespaceDriverSettings } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, newKeys, testDriverSettings, testId } from "../machines/namespace/testing.ts"
import { connect, type GuestSession } from "./GuestSession.ts"
import { BLOCK, header, paxHeader } from "./Tar.ts"

/** A machine with its session; `close` destroys it and returns what it left behind (should be nothing). */
export interface TestGuest {
  readonly machine: Machine
  readonly guest: GuestSession
  readonly close: () => Promise<ReadonlyArray<string>>
}

/** Makes a size `s` machine (with test overrides, on a driver with `settings`) and connects to it. */
export const testGuest = async (
  label: string,
  override: Partial<Pick<Size, "memoryBytes" | "diskBytes">> = {},
  settings: Partial<typeof NamespaceDriverSettings.defaults> = {},
): Promise<TestGuest> => {
  const base = await ensureTestBase()
  const driver = make({ ...testDriverSettings, ...settings })
  const keys = newKeys()
  const id = testId(label)
  const scope = Effect.runSync(Scope.make())
  const made = await Effect.runPromiseExit(
    Scope.extend(
      Effect.gen(function* () {
        const machine = yield* scopedOn(driver, {
          id,
          size: "s",
          base: base.rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
          override: { memoryBytes: 512 * 1024 * 1024, ...override },
        })
        const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
        return { machine, guest }
      }),
      scope,
    ),
  )
  const close = async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    return leftovers(id)
  }
  if (Exit.isFailure(made)) {
    await close()
    throw new Error(String(made.cause))
  }
  return { ...made.value, close }
}

/** The typed view of one object store of the test storage. */
export const store = (bucket: "inputs" | "outputs" | "files") =>
  Effect.flatMap(Storage, (s) => ObjectStore.make(s.names.objects[bucket].name))

const pad = (n: number) => Buffer.alloc((BLOCK - (n % BLOCK)) % BLOCK)

/** One archive entry: a header (with an optional PAX header before it) and its padded data. */
export const entry = (
  name: string,
  type: string,
  data: Buffer = Buffer.alloc(0),
  extra: Partial<Parameters<typeof header>[0]> = {},
  pax?: Record<string, string>,
) =>
  Buffer.concat([
    ...(pax ? [paxHeader(pax)] : []),
    header({ name, type, size: type === "0" ? data.length : 0, ...extra }),
    data,
    pad(data.length),
  ])

/** Entries followed by the two closing blocks. */
export const archive = (...entries: ReadonlyArray<Buffer>) =>
  Buffer.concat([...entries, Buffer.alloc(2 * BLOCK)])
