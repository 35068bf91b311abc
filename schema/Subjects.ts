/**
 * Every NATS subject, stream, KV bucket and object store name of Hangar (DESIGN.md, storage map),
 * with its retention. Nothing else writes a subject or storage name as a literal.
 *
 * Names are computed from an optional prefix so tests can create the whole storage under a unique
 * prefix and share one nats-server: with prefix `p`, bucket `accounts` is `p_accounts`, stream
 * `MAILBOX` is `p_MAILBOX` and subject `mb.run.3.run_x` is `p.mb.run.3.run_x`. Production uses no
 * prefix. Each builder is preceded by the literal pattern it makes (without the prefix).
 */

const DAY_MS = 24 * 60 * 60 * 1000

/** The KV buckets. */
export const kvBuckets = [
  "accounts",
  "members",
  "invites",
  "keys",
  "functions",
  "versions",
  "providers",
  "secrets",
  "runs",
  "commands",
  "actors",
  "leases",
  "hosts",
  "uploads",
  "logins",
  "agents",
  "idempotency",
  "console",
] as const
export type KvBucket = (typeof kvBuckets)[number]

/** The JetStream streams. */
export const streams = ["MAILBOX", "OUTPUT", "LEDGER", "EVENTS"] as const
export type StreamKey = (typeof streams)[number]

/** The object stores. */
export const objectStores = ["inputs", "outputs", "logs", "files"] as const
export type ObjectStoreKey = (typeof objectStores)[number]

/** A KV bucket as created; `maxAgeMs` 0 keeps values forever (account lifetime). */
export interface KvSpec {
  readonly name: string
  /** Age after the last write at which a value is removed; 0 = never. */
  readonly maxAgeMs: number
  /** Values kept per key (1 = only the latest). */
  readonly history: number
}

/** A stream as created. */
export interface StreamSpec {
  readonly name: string
  readonly subjects: ReadonlyArray<string>
  /** `workqueue`: a message is removed once acknowledged; `limits`: kept until `maxAgeMs`. */
  readonly retention: "limits" | "workqueue"
  /** 0 = no age limit. */
  readonly maxAgeMs: number
  /** Window in which a repeated `Nats-Msg-Id` is recognised and not stored again. */
  readonly duplicateWindowMs: number
  /** NATS message schedules (timers), nats-server ≥ 2.12. */
  readonly allowSchedules: boolean
  /** Per-message TTL (`Nats-TTL`), nats-server ≥ 2.11. */
  readonly allowMsgTtl: boolean
  /** Append-only: no message delete and no purge through the API. */
  readonly appendOnly: boolean
}

/** An object store as created. */
export interface ObjectStoreSpec {
  readonly name: string
  readonly maxAgeMs: number
}

/** Retention of every bucket, stream and object store (DESIGN.md, storage map). */
export const retention = {
  kv: {
    accounts: 0,
    members: 0,
    invites: 7 * DAY_MS,
    keys: 0,
    functions: 0,
    versions: 0,
    providers: 0,
    secrets: 0,
    runs: 30 * DAY_MS,
    commands: 30 * DAY_MS,
    actors: 0,
    leases: 0,
    hosts: 60_000, // a live host rewrites its record every 3 s; a crashed host's record ages out
    uploads: 30 * DAY_MS, // upload records, as long as the `files` objects they describe
    logins: DAY_MS, // CLI logins: approved or expired within 10 minutes, then only read for a while
    agents: 30 * DAY_MS, // agent loops: removed when the run ends; what a crash left ages out with the run
    idempotency: DAY_MS, // a creating request's answer, kept for its Idempotency-Key's 24 hours
    console: 2 * DAY_MS, // console sign-in links (10 minutes) and sessions (12 hours), by their hashes
  } satisfies Record<KvBucket, number>,
  streams: {
    MAILBOX: 0, // work queue: messages go when handled
    OUTPUT: 30 * DAY_MS,
    LEDGER: 400 * DAY_MS,
    EVENTS: 30 * DAY_MS,
  } satisfies Record<StreamKey, number>,
  objects: 30 * DAY_MS,
} as const

// Subject tokens must not contain separators or wildcards; a bad token is a programming error.
const token = (value: string | number): string => {
  const s = String(value)
  if (s.length === 0 || /[\s.*>]/.test(s)) throw new Error(`invalid subject token: ${JSON.stringify(s)}`)
  return s
}

/** All names of one storage instance (see `storageNames`). */
export interface StorageNames {
  /** The prefix given ("" in production). */
  readonly prefix: string
  readonly kv: { readonly [K in KvBucket]: KvSpec }
  readonly streams: { readonly [K in StreamKey]: StreamSpec }
  readonly objects: { readonly [K in ObjectStoreKey]: ObjectStoreSpec }
  readonly subjects: {
    /** `mb.<type>.<partition>.<id>`: a message to actor `<type>/<id>`. */
    readonly mailbox: (type: string, partition: number, id: string) => string
    /** `mb.<type>.<partition>.*`: one partition's messages (the owner's consumer filter). */
    readonly mailboxPartition: (type: string, partition: number) => string
    /** `mbt.<type>.<partition>.<id>.<timer>`: where the schedule of a timer sits; it fires into the mailbox. */
    readonly timer: (type: string, partition: number, id: string, timer: string) => string
    /** `mbt.<type>.<partition>.<id>.>`: every timer of one actor (one purge cancels them all). */
    readonly timers: (type: string, partition: number, id: string) => string
    /**
     * `term.<route>.<part>` (core NATS, not stored): a terminal route between a relay and the host
     * end (`core/TerminalRoute.ts`): `join`, `in` (towards the host), `out` (towards the caller).
     */
    readonly terminal: (route: string, part: "join" | "in" | "out") => string
    /** `out.<run>.<cmd>`: output chunks of one command. */
    readonly output: (run: string, cmd: string) => string
    /** `out.<run>.*`: output of every command of a run. */
    readonly outputRun: (run: string) => string
    /** `ledger.<account>`: ledger entries of an account. */
    readonly ledger: (account: string) => string
    /** `evt.<account>.<run>`: events of one run. */
    readonly events: (account: string, run: string) => string
    /** `evt.<account>.*`: events of every run of an account. */
    readonly eventsAccount: (account: string) => string
    /** `evt.<account or *>.<run or *>`: what `hangar admin watch` follows (undefined = every one). */
    readonly eventsWatch: (account: string | undefined, run: string | undefined) => string
  }
}

/** The names of the storage under `prefix` (none by default). */
export const storageNames = (prefix = ""): StorageNames => {
  if (prefix !== "" && !/^[A-Za-z0-9_-]+$/.test(prefix)) throw new Error(`invalid storage prefix: ${prefix}`)
  const name = (base: string) => (prefix === "" ? base : `${prefix}_${base}`)
  const subject = (...parts: ReadonlyArray<string>) => (prefix === "" ? parts : [prefix, ...parts]).join(".")

  const kv = Object.fromEntries(
    kvBuckets.map((b) => [b, { name: name(b), maxAgeMs: retention.kv[b], history: 1 } satisfies KvSpec]),
  ) as unknown as StorageNames["kv"]

  const stream = (
    key: StreamKey,
    roots: ReadonlyArray<string>,
    extra: Partial<Omit<StreamSpec, "name" | "subjects">> = {},
  ): StreamSpec => ({
    name: name(key),
    subjects: roots.map((r) => subject(r, ">")),
    retention: "limits",
    maxAgeMs: retention.streams[key],
    duplicateWindowMs: 2 * 60 * 1000,
    allowSchedules: false,
    allowMsgTtl: false,
    appendOnly: false,
    ...extra,
  })

  const objects = Object.fromEntries(
    objectStores.map((o) => [o, { name: name(o), maxAgeMs: retention.objects } satisfies ObjectStoreSpec]),
  ) as unknown as StorageNames["objects"]

  return {
    prefix,
    kv,
    streams: {
      // A longer duplicate window than the default 2 minutes: an outbox re-published by the next
      // owner after a lease expiry must still be recognised.
      MAILBOX: stream("MAILBOX", ["mb", "mbt"], {
        retention: "workqueue",
        duplicateWindowMs: 10 * 60 * 1000,
        allowSchedules: true,
        allowMsgTtl: true,
      }),
      OUTPUT: stream("OUTPUT", ["out"]),
      LEDGER: stream("LEDGER", ["ledger"], { appendOnly: true }),
      EVENTS: stream("EVENTS", ["evt"]),
    },
    objects,
    subjects: {
      // mb.<type>.<partition>.<id>
      mailbox: (type, partition, id) => subject("mb", token(type), token(partition), token(id)),
      // mb.<type>.<partition>.*
      mailboxPartition: (type, partition) => subject("mb", token(type), token(partition), "*"),
      // mbt.<type>.<partition>.<id>.<timer>
      timer: (type, partition, id, timer) =>
        subject("mbt", token(type), token(partition), token(id), token(timer)),
      // mbt.<type>.<partition>.<id>.>
      timers: (type, partition, id) => subject("mbt", token(type), token(partition), token(id), ">"),
      // term.<route>.<part>
      terminal: (route, part) => subject("term", token(route), part),
      // out.<run>.<cmd>
      output: (run, cmd) => subject("out", token(run), token(cmd)),
      // out.<run>.*
      outputRun: (run) => subject("out", token(run), "*"),
      // ledger.<account>
      ledger: (account) => subject("ledger", token(account)),
      // evt.<account>.<run>
      events: (account, run) => subject("evt", token(account), token(run)),
      // evt.<account>.*
      eventsAccount: (account) => subject("evt", token(account), "*"),
      // evt.<account|*>.<run|*>
      eventsWatch: (account, run) =>
        subject("evt", account === undefined ? "*" : token(account), run === undefined ? "*" : token(run)),
    },
  }
}

/** KV keys with structure. */
export const kvKeys = {
  // <account>.<run>  (bucket `runs`)
  run: (account: string, run: string) => `${token(account)}.${token(run)}`,
  // <account>.*  (bucket `runs`: every run of an account)
  runsOf: (account: string) => `${token(account)}.*`,
  // <account>.last.<function>  (bucket `runs`: the id of the function's newest run; `runsOf` skips it)
  lastRun: (account: string, fn: string) => `${token(account)}.last.${token(fn)}`,
  // <run>.<seq>  (bucket `commands`)
  command: (run: string, seq: number) => `${token(run)}.${token(seq)}`,
  // <run>.*  (bucket `commands`: every command of a run; `commandIndex` keys are not matched)
  commandsOf: (run: string) => `${token(run)}.*`,
  // <run>.id.<command>  (bucket `commands`: the sequence of a command id)
  commandIndex: (run: string, command: string) => `${token(run)}.id.${token(command)}`,
  // <run>.<n>  (object store `logs`: the run's log part n, from 1)
  logPart: (run: string, n: number) => `${token(run)}.${token(n)}`,
  // <type>.<id>  (bucket `actors`)
  actor: (type: string, id: string) => `${token(type)}.${token(id)}`,
  // <type>.>  (bucket `actors`: every actor of a type)
  actorsOf: (type: string) => `${token(type)}.>`,
  // r.<run>  (bucket `agents`: the run has an agent that should be working; written by the run actor)
  agentRun: (run: string) => `r.${token(run)}`,
  // l.<run>  (bucket `agents`: the lease of the worker running the run's loop)
  agentLease: (run: string) => `l.${token(run)}`,
  // c.<run>  (bucket `agents`: the head of the run's persisted conversation)
  agentHead: (run: string) => `c.${token(run)}`,
  // i.<run>.<n>.<part>  (bucket `agents`: part of the sealed conversation item n)
  agentItem: (run: string, n: number, part: number) => `i.${token(run)}.${token(n)}.${token(part)}`,
  // i.<run>.>  (bucket `agents`: every item part of a run)
  agentItemsOf: (run: string) => `i.${token(run)}.>`,
  // datakey.<account>  (bucket `secrets`: the account's data key, wrapped by the master key)
  dataKey: (account: string) => `datakey.${token(account)}`,
} as const
