/** Helpers for tests of the guest's run-level work: one real machine and session, real storage. */
import { Effect, Exit, Scope } from "effect"
import { Header } from "tar"
import * as ObjectStore from "../../core/ObjectStore.ts"
import { Storage } from "../../core/Storage.ts"
import { ensureTestBase } from "../bases/Bases.ts"
import { type Machine, type Size, scopedOn } from "../machines/MachineDriver.ts"
import { make, type NamespaceDriverSettings } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, newKeys, testDriverSettings, testId } from "../machines/namespace/testing.ts"
import { connect, type GuestSession } from "./GuestSession.ts"
import { BLOCK } from "./Tar.ts"

/** A machine with its session; `close` destroys it and returns what it left behind (should be nothing). */
export interface TestGuest {
  readonly machine: Machine
  readonly guest: GuestSession
  /** The key a session logs in with (for more sessions to the machine). */
  readonly privateKey: string
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
  return { ...made.value, privateKey: keys.client.private, close }
}

/** The typed view of one object store of the test storage. */
export const store = (bucket: "inputs" | "outputs" | "files") =>
  Effect.flatMap(Storage, (s) => ObjectStore.make(s.names.objects[bucket].name))

const pad = (n: number) => Buffer.alloc((BLOCK - (n % BLOCK)) % BLOCK)

/** What a crafted header may hold besides its name and type (one-letter code). */
export interface HeaderFields {
  readonly size?: number
  readonly mode?: number
  readonly mtime?: number
  readonly linkname?: string
  readonly devmajor?: number
  readonly devminor?: number
}

/**
 * One tar header block, crafted as an attacker would: any type, link target or device numbers
 * (`node-tar`'s encoder; names longer than ustar holds are cut, so long names go in PAX headers).
 */
export const header = (entry: { readonly name: string; readonly type: string } & HeaderFields): Buffer => {
  const h = new Header({
    path: entry.name,
    // The one-letter code; the encoder takes a code as well as a name.
    type: entry.type as never,
    size: entry.size ?? 0,
    mode: entry.mode ?? 0o644,
    uid: 0,
    gid: 0,
    mtime: new Date((entry.mtime ?? 0) * 1000),
    ...(entry.linkname === undefined ? {} : { linkpath: entry.linkname }),
    devmaj: entry.devmajor ?? 0,
    devmin: entry.devminor ?? 0,
  })
  h.encode()
  return h.block as Buffer
}

/** A PAX extended header entry (header and padded records), any keys, for the entry after it. */
export const paxHeader = (records: Readonly<Record<string, string>>): Buffer => {
  const parts: Array<Buffer> = []
  for (const [k, v] of Object.entries(records)) {
    const body = ` ${k}=${v}\n`
    const base = Buffer.byteLength(body)
    // The length counts its own digits.
    let len = base + String(base).length
    if (String(len).length > String(base).length) len = base + String(len).length
    parts.push(Buffer.from(`${len}${body}`, "utf8"))
  }
  const data = Buffer.concat(parts)
  return Buffer.concat([header({ name: "PaxHeader", type: "x", size: data.length }), data, pad(data.length)])
}

/** One archive entry: a header (with an optional PAX header before it) and its padded data. */
export const entry = (
  name: string,
  type: string,
  data: Buffer = Buffer.alloc(0),
  extra: HeaderFields = {},
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
