/**
 * The host agent's own settings: its id, its budget of vCPUs and memory for machines, its machine
 * driver, and how often it beats. Empty or zero values mean "derive from this machine", resolved
 * once at start by `resolve` (so importing this file reads nothing from the machine).
 */
import { createHash } from "node:crypto"
import { readFile } from "node:fs/promises"
import { hostname, totalmem } from "node:os"
import { Config, Context, Data, Effect, Layer, Schema } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import { dataDir } from "../../core/DataDir.ts"
import { type DriverKind, HostId, hostHeartbeatMs, hostStaleMs } from "../../schema/Host.ts"
import { hostVcpuBudget } from "../../schema/Limits.ts"

/** The host agent's settings; `id: ""` and `memoryMib: 0` are derived by `resolve`. */
export const HostSettings = defineSettings(
  "host-agent/HostSettings",
  {
    /** `HANGAR_HOST_ID`; "" = `host_<26 base32>` hashed from the machine id and the data folder. */
    id: "",
    /** `HANGAR_HOST_VCPUS`: vCPUs all machines together may have. */
    vcpus: hostVcpuBudget as number,
    /** `HANGAR_HOST_MEMORY_MIB`; 0 = the machine's memory minus `reserveMib(total)` for the host itself. */
    memoryMib: 0,
    /**
     * `HANGAR_MACHINE_DRIVER`: `namespace` (default) or `qemu`. Set `qemu` on hosts where KVM boots
     * guests; a usable `/dev/kvm` does not prove that (under nested paravirtual KVM, as on our
     * development machines, stock guest kernels hang), so it is a decision, not a guess.
     */
    driver: "namespace" as DriverKind,
    /** `HANGAR_HOST_HEARTBEAT_MS`: how often the record's `heartbeat_at` is refreshed. */
    heartbeatMs: hostHeartbeatMs as number,
    /** `HANGAR_HOST_STALE_MS`: a record whose heartbeat is older is a gone host (readers). */
    staleMs: hostStaleMs as number,
    /** The data folder the default id is derived from (two checkouts on one machine are two hosts). */
    dataDir: dataDir as string,
    machineIdPath: "/etc/machine-id",
  },
  (d) => ({
    id: env.string("HOST_ID", d.id),
    vcpus: env.integer("HOST_VCPUS", d.vcpus),
    memoryMib: env.integer("HOST_MEMORY_MIB", d.memoryMib),
    driver: Config.literal("namespace", "qemu")("HANGAR_MACHINE_DRIVER").pipe(Config.withDefault(d.driver)),
    heartbeatMs: env.integer("HOST_HEARTBEAT_MS", d.heartbeatMs),
    staleMs: env.integer("HOST_STALE_MS", d.staleMs),
  }),
)
export type HostSettingsValue = typeof HostSettings.defaults

/** What the host offers, with every derived value filled in. */
export interface HostIdentity {
  readonly id: HostId
  readonly driver: DriverKind
  readonly vcpus: number
  readonly memoryMib: number
}

const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

/** `host_` and 26 base32 characters of the SHA-256 of the machine id and the data folder: stable across restarts. */
export const derivedId = (machineId: string, dir: string): HostId => {
  const digest = createHash("sha256").update(`${machineId.trim()}\0${dir}`).digest()
  let bits = 0n
  for (const b of digest.subarray(0, 17)) bits = (bits << 8n) | BigInt(b)
  let body = ""
  for (let i = 0; i < 26; i++) {
    body = alphabet[Number(bits & 31n)] + body
    bits >>= 5n
  }
  return `host_${body}` as HostId
}

/** Memory kept for the host itself (agent, page cache, nats): an eighth of it, at least 1 GiB. */
export const reserveMib = (totalMib: number): number => Math.max(1024, Math.ceil(totalMib / 8))

/** `HANGAR_HOST_ID` is not a valid host id (it is also the KV key). */
export class HostIdInvalid extends Data.TaggedError("HostIdInvalid")<{
  readonly id: string
  readonly message: string
}> {}

/** Fills in the derived values of `s` from this machine; fails when a configured id is malformed. */
export const resolve = (s: HostSettingsValue): Effect.Effect<HostIdentity, HostIdInvalid> =>
  Effect.promise(async () => {
    const machineId =
      s.id === "" ? await readFile(s.machineIdPath, "utf8").catch(() => hostname()) : undefined
    const totalMib = Math.floor(totalmem() / 1024 ** 2)
    return {
      id: machineId === undefined ? s.id : derivedId(machineId, s.dataDir),
      driver: s.driver,
      vcpus: s.vcpus,
      memoryMib: s.memoryMib > 0 ? s.memoryMib : Math.max(0, totalMib - reserveMib(totalMib)),
    }
  }).pipe(
    Effect.flatMap((found) =>
      Schema.decodeUnknown(HostId)(found.id).pipe(
        Effect.mapError(
          () =>
            new HostIdInvalid({
              id: found.id,
              message: `HANGAR_HOST_ID ${JSON.stringify(found.id)} is not a valid host id`,
            }),
        ),
        Effect.map((id): HostIdentity => ({ ...found, id })),
      ),
    ),
  )

/** This host as resolved once at start. */
export class Host extends Context.Tag("host-agent/Host")<Host, HostIdentity>() {}

/** Resolves `HostSettings` into the host's identity and budget. */
export const layerHost: Layer.Layer<
  Host,
  HostIdInvalid,
  Context.Tag.Identifier<typeof HostSettings.Tag>
> = Layer.effect(Host, Effect.flatMap(HostSettings.Tag, resolve))
