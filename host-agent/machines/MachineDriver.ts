/**
 * MachineDriver: the service that makes and removes machines. A machine is a root filesystem over
 * a read-only base, a `/workspace` disk of the size's capacity, CPU and memory limits, its own
 * network, and an sshd reachable at `ssh` whose host key the caller chose. Drivers: `namespace`
 * (Linux namespaces and cgroups) and, later, `qemu`.
 */

import { createHash } from "node:crypto"
import { chmodSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { readdir, readFile, rm } from "node:fs/promises"
import { join } from "node:path"
import type { Scope } from "effect"
import { Context, Data, Effect, Option } from "effect"
import ssh2 from "ssh2"
import { normalNice, readText } from "./HostFiles.ts"

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
  /**
   * Made ahead of need (a warm machine, `WarmPool.ts`): until `wanted`, its making and its own
   * processes yield the host's CPU to running work (`backgroundNice`, or its weight), so a
   * refill never slows the run that just took a machine.
   */
  readonly background?: boolean
}

/**
 * How much nicer than the host agent (`normalNice`) a background machine's work runs
 * (`MachineSpec.background`), and the CPU weight of a group of its processes: the kernel's weight
 * of a task that much nicer (110 against 1,024).
 */
export const BACKGROUND_NICE = 10
export const BACKGROUND_WEIGHT = 110
export const NORMAL_WEIGHT = 1024

/** The nice value background work runs at: `BACKGROUND_NICE` over the host agent's, at most 19. */
export const backgroundNice = (): number => Math.min(19, normalNice() + BACKGROUND_NICE)

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
  /**
   * Machine `id`, made or being made in the background (`MachineSpec.background`), is wanted by a
   * run now: from here on it, and what is left of its making, get the CPU as any run's machine.
   * Answers at once; a machine not made in the background, or gone, is left as it is.
   */
  readonly wanted: (id: string) => Effect.Effect<void>
  /** Removes every trace of machine `id` (processes, mounts, devices, cgroups, network, files); idempotent. */
  readonly destroy: (id: string) => Effect.Effect<void, MachineDestroyFailed>
  /** The ids of the machines on this host made for `owner` (see `MachineSpec.owner`). */
  readonly owned: (owner: string) => Effect.Effect<ReadonlyArray<string>>
  /**
   * Claims machine `id` for `owner` before it is made: its folder, naming the owner, with the
   * caller's `note`. A host agent that dies before `create` has made the folder still finds the
   * machine among those it `owned` (and `create` takes the claimed folder).
   */
  readonly claim: (id: string, owner: string, note: string) => Effect.Effect<void, MachineKeepFailed>
  /**
   * Records in the machine's folder what a later life of its host agent needs to take it over
   * (`adopt`): the machine as `create` answered it, and the caller's `note` (its own, opaque here).
   */
  readonly keep: (machine: Machine, note: string) => Effect.Effect<void, MachineKeepFailed>
  /**
   * What machine `id`'s folder kept: the machine and the note once kept (`keep`) while its process
   * still runs, only the note when it was claimed and never kept; none when nothing was recorded or
   * the kept machine's process is gone (it died with its host agent, or since).
   */
  readonly adopt: (id: string) => Effect.Effect<Option.Option<Kept>>
}

/** What `claim` and `keep` recorded of a machine. */
export interface Kept {
  readonly note: string
  /** Set once the machine was kept (made and ready), and only while it runs. */
  readonly machine?: Machine
}

/** The machine's folder could not record what a later life needs. */
export class MachineKeepFailed extends Data.TaggedError("MachineKeepFailed")<{
  readonly id: string
  readonly detail: string
}> {}

// The small files of a machine's folder, and `/proc`, are read and written synchronously (tens of
// microseconds each): on a run's way to its machine, the thread pool that asynchronous calls queue
// on is often busy with a machine being made or removed, and each call waited there 0.5–2 ms.

/** Whether process `pid` runs (a zombie, which still answers signal 0, does not). */
export const alive = async (pid: number): Promise<boolean> => {
  const stat = readText(`/proc/${pid}/stat`)
  return stat !== undefined && stat !== "" && !/^\d+ \(.*\) [ZX]/.test(stat)
}

/** What a machine id must be (it names the machine's folder, cgroups and network devices). */
export const MACHINE_ID = /^[a-z0-9_]{1,64}$/

/** The file in a machine's folder that `claim` and `keep` write (root only: the note is the caller's). */
const KEPT_FILE = "kept.json"

// Whole or not at all: a crash midway leaves the earlier file (or none), never half of one.
const writeKept = async (dir: string, kept: Kept) => {
  const file = join(dir, KEPT_FILE)
  writeFileSync(`${file}.new`, JSON.stringify(kept), { mode: 0o600 })
  renameSync(`${file}.new`, file)
}

/**
 * Makes machine `id`'s folder in `machinesDir` with `mode`, naming `owner`; or takes the one a
 * `claim` of the same owner made, which holds nothing else yet. Fails `EEXIST` when the id is in use.
 *
 * A folder with an owner appears whole: it is made and its owner written under a name of its own
 * (`makingName`), then renamed into place. A host agent killed midway leaves only that name, which
 * `ownedIn` removes for its owner; a folder naming no owner would be no one's to remove.
 */
export const machineFolder = async (
  machinesDir: string,
  id: string,
  owner: string | undefined,
  mode = 0o700,
) => {
  if (!MACHINE_ID.test(id)) throw new Error(`machine id must match ${MACHINE_ID}`)
  const dir = join(machinesDir, id)
  mkdirSync(machinesDir, { recursive: true })
  if (owner === undefined) {
    mkdirSync(dir, { mode })
    return dir
  }
  // A rename onto an empty folder replaces it: one that exists is in use, empty or not.
  if (!existsSync(dir)) {
    const making = join(machinesDir, makingName(id, owner))
    rmSync(making, { recursive: true, force: true })
    mkdirSync(making, { mode })
    let placed = false
    try {
      writeFileSync(join(making, OWNER_FILE), owner)
      renameSync(making, dir)
      placed = true
      return dir
    } catch (e) {
      // Made meanwhile by another: in use, or a claim of the same owner (below).
      const code = (e as NodeJS.ErrnoException).code
      if (code !== "EEXIST" && code !== "ENOTEMPTY") throw e
    } finally {
      if (!placed) rmSync(making, { recursive: true, force: true })
    }
  }
  const named = readText(join(dir, OWNER_FILE))
  const entries = readdirSync(dir)
  if (named !== owner || entries.some((f) => f !== OWNER_FILE && f !== KEPT_FILE))
    throw Object.assign(new Error(`EEXIST: machine folder ${dir} is in use`), { code: "EEXIST" })
  chmodSync(dir, mode)
  return dir
}

/** What `machineFolder` names a folder it is making for `owner` (a dot first: never a machine id). */
export const makingName = (id: string, owner: string) => `${halfMadeOf(id)}${ownerTag(owner)}`

/** How the name of a folder made for machine `id`, and left half made, begins. */
export const halfMadeOf = (id: string) => `${MAKING}${id}.`

const MAKING = ".making."

/** How a half-made folder's name ends for `owner` (which may hold any character). */
const ownerTag = (owner: string) => createHash("sha256").update(owner).digest("hex").slice(0, 16)

/** `claim` for drivers whose machines have a folder in `machinesDir` (see `machineFolder`). */
export const claimIn =
  (machinesDir: string): MachineDriverService["claim"] =>
  (id, owner, note) =>
    Effect.tryPromise({
      try: async () => writeKept(await machineFolder(machinesDir, id, owner), { note }),
      catch: (e) => new MachineKeepFailed({ id, detail: String(e) }),
    })

/** `keep` for drivers whose machines have a folder in `machinesDir` and a `handle.pid` that runs them. */
export const keepIn =
  (machinesDir: string): MachineDriverService["keep"] =>
  (machine, note) =>
    Effect.tryPromise({
      try: () => writeKept(join(machinesDir, machine.id), { machine, note }),
      catch: (e) => new MachineKeepFailed({ id: machine.id, detail: String(e) }),
    })

/** `adopt` for the drivers `claimIn` and `keepIn` serve: a kept machine only while its `handle.pid` runs. */
export const adoptIn =
  (machinesDir: string): MachineDriverService["adopt"] =>
  (id) =>
    Effect.promise(async () => {
      if (!MACHINE_ID.test(id)) return Option.none()
      const text = await readFile(join(machinesDir, id, KEPT_FILE), "utf8").catch(() => undefined)
      if (text === undefined) return Option.none()
      try {
        const kept = JSON.parse(text) as Kept
        if (typeof kept.note !== "string") return Option.none()
        if (kept.machine === undefined) return Option.some({ note: kept.note })
        const pid = Number(kept.machine.handle.pid)
        // A pid reused by another process passes here; the pinned host key refuses it at connect.
        if (kept.machine.id !== id || !Number.isInteger(pid) || pid <= 0 || !(await alive(pid)))
          return Option.none()
        return Option.some(kept)
      } catch {
        return Option.none()
      }
    })

/** The file in a machine's folder that names its owner. */
const OWNER_FILE = "owner"

/**
 * The machines in `machinesDir` whose folder names `owner`. The folders a life of `owner` left half
 * made (`machineFolder`) are removed on the way: nothing was made in them. So it is asked while
 * `owner` makes no folder (a host agent's start, a test's end).
 */
export const ownedIn = (machinesDir: string, owner: string): Effect.Effect<ReadonlyArray<string>> =>
  Effect.promise(async () => {
    const found: Array<string> = []
    const halfMade = `.${ownerTag(owner)}`
    for (const id of await readdir(machinesDir).catch(() => [] as Array<string>)) {
      if (id.startsWith(MAKING) && id.endsWith(halfMade)) {
        await rm(join(machinesDir, id), { recursive: true, force: true })
        continue
      }
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
    // Every command and shell sees the bases' 1440x900 display (started on first use by the base's
    // `display-up`); without PAM, sshd reads no /etc/environment.
    "SetEnv DISPLAY=:99",
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
