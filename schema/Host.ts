/**
 * A host agent's record in KV `hosts` (key: the host id): what the host offers (driver, vCPU and
 * memory budget, bases on disk), the machines it runs, what is left free, and a heartbeat.
 *
 * Readers (the scheduler, `GET /v1/bases`) decide a host is gone when its heartbeat is older than
 * `hostStaleMs`, so a host that died without removing its record drops out within 15 seconds. The
 * pure helpers here (`isLive`, `listBases`) are in the contract so every role can use them.
 */
import { Schema } from "effect"
import { type BaseInfo, BaseInfo as BaseInfoSchema } from "./Base.ts"
import { Count, Enum, IntAtLeast, Timestamp } from "./Common.ts"
import { BaseName, RunId } from "./Ids.ts"

/** A host older than this since its last heartbeat counts as gone. */
export const hostStaleMs = 15_000

/** How often a host refreshes its heartbeat by default (five beats fit in `hostStaleMs`). */
export const hostHeartbeatMs = 3_000

/**
 * A host id: also the KV key, so a single subject token of lowercase letters, digits, `_` and `-`.
 * The default is `host_<26 base32>` derived from the machine id and the data folder.
 */
export const HostId = Schema.String.pipe(
  Schema.pattern(/^[a-z0-9][a-z0-9_-]{0,63}$/, {
    message: () => "must be 1 to 64 of a-z, 0-9, _ and -, starting with a letter or digit",
  }),
  Schema.brand("HostId"),
).annotations({ identifier: "HostId" })
export type HostId = typeof HostId.Type

/** The machine drivers. */
export const DriverKind = Enum("namespace", "qemu")
export type DriverKind = typeof DriverKind.Type

/** A machine size name (spec "Machine sizes"). */
export const SizeName = Enum("s", "m", "l", "xl")
export type SizeName = typeof SizeName.Type

/** A machine running (or being made) on the host, with the resources it holds. */
export const HostMachine = Schema.Struct({
  /** The machine id (`[a-z0-9_]{1,64}`, as the drivers require). */
  id: Schema.String.pipe(Schema.pattern(/^[a-z0-9_]{1,64}$/)),
  run: Schema.optional(RunId),
  size: SizeName,
  vcpus: IntAtLeast(1),
  memory_mib: IntAtLeast(1),
}).annotations({ identifier: "HostMachine" })
export type HostMachine = typeof HostMachine.Type

/** The record of one host in KV `hosts`. */
export const HostRecord = Schema.Struct({
  id: HostId,
  driver: DriverKind,
  /** The vCPU budget of all machines together (14 by default). */
  vcpus: Count,
  /** The memory budget of all machines together. */
  memory_mib: Count,
  bases: Schema.Array(BaseInfoSchema),
  /** Bases the host is building now (their names are chosen when the build starts). */
  building: Schema.optional(Schema.Array(BaseName)),
  started_at: Timestamp,
  heartbeat_at: Timestamp,
  machines: Schema.Array(HostMachine),
  free_vcpus: Count,
  free_memory_mib: Count,
}).annotations({ identifier: "HostRecord" })
export type HostRecord = typeof HostRecord.Type

/** Whether a host's heartbeat is at most `staleMs` old at `now` (exactly `staleMs` still counts). */
export const isLive = (host: HostRecord, now: number, staleMs: number = hostStaleMs): boolean =>
  now - Date.parse(host.heartbeat_at) <= staleMs

// `<distro>-<release>-<yyyymmdd>-<hash>`: the date is the token before the hash.
const dateOf = (name: string): string => name.split("-").at(-2) ?? ""

// Debian's releases, newest first. A host builds all its bases on the same day, so among bases of
// one date the newer release comes first and is "the newest base" (the default of publishing);
// a release not listed here comes after them, by name.
const releases = ["duke", "forky", "trixie", "bookworm", "bullseye", "buster"]
const rankOf = (name: string): number => {
  const rank = releases.indexOf(name.split("-")[1] ?? "")
  return rank < 0 ? releases.length : rank
}

/**
 * The bases known to any of `hosts` (pass only live ones), one item per name, newest first: by the
 * date in the name, then by release (newer first), then by name (ascending, so the order is total
 * and stable).
 */
export const listBases = (hosts: ReadonlyArray<HostRecord>): ReadonlyArray<BaseInfo> => {
  const byName = new Map<string, BaseInfo>()
  for (const host of hosts)
    for (const base of host.bases) if (!byName.has(base.name)) byName.set(base.name, base)
  return [...byName.values()].sort((a, b) => newestFirst(a.name, b.name))
}

/** Orders base names as `listBases` orders its items. */
export const newestFirst = (a: string, b: string): number => {
  const da = dateOf(a)
  const db = dateOf(b)
  if (da !== db) return da < db ? 1 : -1
  const ra = rankOf(a)
  const rb = rankOf(b)
  if (ra !== rb) return ra - rb
  return a < b ? -1 : a > b ? 1 : 0
}

/**
 * The bases some of `hosts` (pass only live ones) are building and none has finished, newest
 * first: a function may name one, and its runs wait in the queue until a host has it.
 */
export const buildingBases = (hosts: ReadonlyArray<HostRecord>): ReadonlyArray<BaseName> => {
  const finished = new Set(hosts.flatMap((h) => h.bases.map((b) => b.name)))
  const names = new Set(hosts.flatMap((h) => h.building ?? []).filter((n) => !finished.has(n)))
  return [...names].sort(newestFirst)
}
