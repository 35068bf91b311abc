/**
 * MachineDriver: the service that makes and removes machines. A machine is a root filesystem over
 * a read-only base, a `/workspace` disk of the size's capacity, CPU and memory limits, its own
 * network, and an sshd reachable at `ssh` whose host key the caller chose. Drivers: `namespace`
 * (Linux namespaces and cgroups) and, later, `qemu`.
 */

import { readdir, readFile, writeFile } from "node:fs/promises"
import { join } from "node:path"
import type { Scope } from "effect"
import { Context, Data, Effect } from "effect"
import ssh2 from "ssh2"

/** A machine size name from the spec's size table. */
export type SizeName = "s" | "m" | "l" | "xl"

/** What a size gives a machine. */
export interface Size {
  readonly vcpus: number
  readonly memoryBytes: number
  readonly diskBytes: number
}

const GiB = 1024 ** 3

/** The spec's "Machine sizes" table. */
export const sizes: Readonly<Record<SizeName, Size>> = {
  s: { vcpus: 1, memoryBytes: 2 * GiB, diskBytes: 16 * GiB },
  m: { vcpus: 2, memoryBytes: 4 * GiB, diskBytes: 32 * GiB },
  l: { vcpus: 4, memoryBytes: 8 * GiB, diskBytes: 64 * GiB },
  xl: { vcpus: 8, memoryBytes: 16 * GiB, diskBytes: 128 * GiB },
}

/** What to create. */
export interface MachineSpec {
  /** Unique on the host, `[a-z0-9_]{1,64}`; names every resource of the machine. */
  readonly id: string
  readonly size: SizeName
  /** The base's read-only root filesystem folder. */
  readonly base: string
  /** The one public key (OpenSSH `ssh-ed25519 AAAA…` line) allowed to log in as root. */
  readonly authorizedKey: string
  /** The machine's sshd host key (OpenSSH private key text); the caller pins its public half. */
  readonly hostKey: string
  /** Test-only overrides of the size's memory and disk, to cross limits quickly. */
  readonly override?: Partial<Pick<Size, "memoryBytes" | "diskBytes">>
  /**
   * The host agent that makes it (its host id), kept in the machine's folder: a host agent that
   * restarts finds and removes what its earlier life left (`owned`).
   */
  readonly owner?: string
}

/** Where the machine's sshd listens. */
export interface SshEndpoint {
  readonly host: string
  readonly port: number
  /** The host key's public half, OpenSSH format, for pinning. */
  readonly hostKey: string
}

/** A running machine. */
export interface Machine {
  readonly id: string
  readonly size: SizeName
  readonly limits: Size
  readonly ssh: SshEndpoint
  /** Driver-specific details (pids, folders, device names), for diagnostics and tests. */
  readonly handle: Readonly<Record<string, string | number>>
}

/** Creating a machine failed; whatever was made has been removed again. */
export class MachineCreateFailed extends Data.TaggedError("MachineCreateFailed")<{
  readonly id: string
  readonly step: string
  readonly detail: string
}> {}

/** Removing a machine left something behind (named in `detail`). */
export class MachineDestroyFailed extends Data.TaggedError("MachineDestroyFailed")<{
  readonly id: string
  readonly detail: string
}> {}

/** The machine driver service. */
export interface MachineDriverService {
  readonly kind: "namespace" | "qemu"
  /** Makes a machine and returns once its sshd accepts connections; on failure nothing is left. */
  readonly create: (spec: MachineSpec) => Effect.Effect<Machine, MachineCreateFailed>
  /** Removes every trace of machine `id` (processes, mounts, devices, cgroups, network, files); idempotent. */
  readonly destroy: (id: string) => Effect.Effect<void, MachineDestroyFailed>
  /** The ids of the machines on this host made for `owner` (see `MachineSpec.owner`). */
  readonly owned: (owner: string) => Effect.Effect<ReadonlyArray<string>>
}

/** The file in a machine's folder that names its owner. */
const OWNER_FILE = "owner"

/** Records `owner` in the machine folder `dir` (nothing when there is none). */
export const writeOwner = async (dir: string, owner: string | undefined): Promise<void> => {
  if (owner !== undefined) await writeFile(join(dir, OWNER_FILE), owner)
}

/** The machines in `machinesDir` whose folder names `owner`. */
export const ownedIn = (machinesDir: string, owner: string): Effect.Effect<ReadonlyArray<string>> =>
  Effect.promise(async () => {
    const found: Array<string> = []
    for (const id of await readdir(machinesDir).catch(() => [] as Array<string>)) {
      const named = await readFile(join(machinesDir, id, OWNER_FILE), "utf8").catch(() => undefined)
      if (named === owner) found.push(id)
    }
    return found
  })

/** The Tag of the configured machine driver. */
export class MachineDriver extends Context.Tag("host-agent/MachineDriver")<
  MachineDriver,
  MachineDriverService
>() {}

/** Creates a machine with `driver`; it is destroyed when the scope closes. */
export const scopedOn = (
  driver: MachineDriverService,
  spec: MachineSpec,
): Effect.Effect<Machine, MachineCreateFailed, Scope.Scope> =>
  Effect.acquireRelease(driver.create(spec), (m) => Effect.orDie(driver.destroy(m.id)))

/** Creates a machine with the host's driver; it is destroyed when the scope closes. */
export const scoped = (
  spec: MachineSpec,
): Effect.Effect<Machine, MachineCreateFailed, MachineDriver | Scope.Scope> =>
  Effect.flatMap(MachineDriver, (driver) => scopedOn(driver, spec))

/** The limits of a spec: its size, with the test-only overrides applied. */
export const limitsOf = (spec: MachineSpec): Size => ({ ...sizes[spec.size], ...spec.override })

/**
 * The sshd configuration every driver gives its guest: root by the host agent's key only, the
 * machine's own host key, no PAM or DNS lookups (they cost start time and need nothing), and many
 * sessions on one connection because every command is a channel of the host agent's one session.
 */
export const guestSshdConfig = (listenAddress: string) =>
  `${[
    `ListenAddress ${listenAddress}:22`,
    "HostKey /etc/ssh/hangar_host_key",
    "AuthorizedKeysFile /etc/ssh/hangar_authorized_keys",
    "PermitRootLogin prohibit-password",
    "PubkeyAuthentication yes",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "UsePAM no",
    "StrictModes no",
    "UseDNS no",
    "PrintMotd no",
    "PrintLastLog no",
    "PidFile none",
    "MaxSessions 1024",
    "MaxStartups 100:30:200",
    "Subsystem sftp internal-sftp",
    "LogLevel ERROR",
  ].join("\n")}\n`

/**
 * A fresh ed25519 key pair (OpenSSH format) that ssh2 reads back. ssh2 1.17's generator strips
 * every leading zero byte of the public key, so about one pair in 256 is malformed and the guest
 * session could not connect (mscdex/ssh2#1513); such a pair is made again.
 */
export const newKeyPair = (): { readonly public: string; readonly private: string } => {
  for (;;) {
    const pair = ssh2.utils.generateKeyPairSync("ed25519")
    if (
      !(ssh2.utils.parseKey(pair.public) instanceof Error) &&
      !(ssh2.utils.parseKey(pair.private) instanceof Error)
    )
      return pair
  }
}
