/**
 * A run's command records as the command routes read them (KV `commands`, key `<run>.<sequence>`,
 * written `queued` by the run actor and advanced by the host agent by compare-and-set).
 *
 * - A command id is found through its index entry (`<run>.id.<cid>` → sequence, KV `commands`),
 *   one small read instead of a scan of the run's records. The run actor writes it before the
 *   record and answers `AddCommand` after both, so a command the caller was just given is always
 *   found. Sequences this process has seen are remembered (they never change), so the usual
 *   create-then-wait skips that read.
 * - "Changed after N" uses the bucket's revisions as the change counter: each record's revision is
 *   its last write, so a command shows up again each time it changes (`core/KvChanges.ts`).
 * - Every wait subscribes before it reads, so a write between a read and the wait is never
 *   missed: one record through the run's follower (below; the record is read only when none of
 *   its writes has come), the changes of a run with a KV watch from revision N+1. Callers bound
 *   waits with a timeout; interrupting one (the client went away) ends it.
 */
import { Effect, Option, Schema, Stream } from "effect"
import * as Kv from "../../core/Kv.ts"
import { changesAfter, type KvChangesRead } from "../../core/KvChanges.ts"
import { Nats, type NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import {
  CommandIndex,
  type CommandRecord,
  CommandRecord as CommandRecordSchema,
  endedCommandStates,
} from "../../schema/Command.ts"
import { CommandId } from "../../schema/Ids.ts"
import type { RunState } from "../../schema/Run.ts"
import { StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { CommandRouteSettings } from "./LongPoll.ts"

type Fails = NatsError | Kv.KvValueInvalid

const isCommandId = Schema.is(CommandId)

/** Whether a command has ended (cancelling it changes nothing). */
export const isEnded = (record: CommandRecord): boolean => endedCommandStates.has(record.state)

const commands = Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.commands.name, CommandRecordSchema))

// Command id → `<run>:<sequence>`, as this process learnt them: a sequence never changes once
// given, so reads of a command this gateway created (the usual case: create, then wait) skip the
// index read. Bounded; the oldest entry goes first.
const knownMax = 50_000
const known = new Map<string, string>()

/** Remembers that command `cid` of run `run` has sequence `seq` (the create route's answer). */
export const remember = (run: string, cid: string, seq: number): void => {
  if (known.size >= knownMax) known.delete(known.keys().next().value as string)
  known.set(cid, `${run}:${seq}`)
}

const index = Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.commands.name, CommandIndex))

/** The sequence of command `cid` of run `run`, from its index entry (`<run>.id.<cid>`); none when unknown. */
export const sequenceOf = (
  run: string,
  cid: string,
): Effect.Effect<Option.Option<number>, unknown, Nats | Storage> => {
  if (!isCommandId(cid)) return Effect.succeed(Option.none())
  const seen = known.get(cid) ?? ""
  if (seen.startsWith(`${run}:`)) return Effect.succeed(Option.some(Number(seen.slice(run.length + 1))))
  return Effect.flatMap(index, (kv) => kv.get(kvKeys.commandIndex(run, cid))).pipe(
    Effect.map(Option.map((e) => e.value.sequence)),
    Effect.tap((seq) => Effect.sync(() => Option.map(seq, (n) => remember(run, cid, n)))),
  )
}

/** The current record at sequence `seq` of run `run`, or none. */
export const get = (
  run: string,
  seq: number,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage> =>
  Effect.gen(function* () {
    const kv = yield* commands
    return Option.map(yield* kv.get(kvKeys.command(run, seq)), (e) => e.value)
  })

/** Command `cid` of run `run` with its sequence, or none when the run has no such command. */
export const find = (run: string, cid: string) =>
  Effect.gen(function* () {
    const seq = yield* sequenceOf(run, cid)
    if (Option.isNone(seq)) return Option.none<CommandRecord>()
    return Option.filter(yield* get(run, seq.value), (r) => r.id === cid)
  })

// Each run's records this process waits on are followed by one subscription (`Kv.follow`), so a
// wait on a command needs no subscription of its own, and no read once the command's writes have
// come to it, as they all have for a command created here (the create route follows its run
// before asking for it). Per connection, a follower is kept `followIdleMs` after its last use (a
// minute by default, held within 100 ms to a day), 1,024 at most: past that the least recently
// used go first, never one a wait is using (the count may then go over, rather than a wait fail).
// One whose subscription ended is made again.
const FOLLOWERS_MAX = 1_024
const IDLE_MS_RANGE = [100, 24 * 60 * 60 * 1000] as const

interface Following {
  readonly follower: Kv.KvFollower<CommandRecord>
  usedAt: number
  /** Waits using it (and a create following it, for the moment it takes). */
  holds: number
}

/** The runs followed on one connection, least recently used first. */
interface Followed {
  readonly runs: Map<string, Following>
  readonly idleMs: number
  sweeper: ReturnType<typeof setInterval> | undefined
}

const followed = new WeakMap<object, Followed>()

// Closes the followers idle past their time or ended, and the least recently used past the most
// kept; none that is held. Every entry is looked at (1,024 at most, a few times a minute).
const sweep = (on: Followed, now: number) => {
  let over = on.runs.size - FOLLOWERS_MAX
  for (const [run, f] of on.runs) {
    if (f.holds > 0) continue
    if (over <= 0 && now - f.usedAt < on.idleMs && f.follower.open()) continue
    f.follower.close()
    on.runs.delete(run)
    over--
  }
  if (on.runs.size === 0 && on.sweeper !== undefined) {
    clearInterval(on.sweeper)
    on.sweeper = undefined
  }
}

// Marks `f` used now: the most recently used, last in the order.
const touch = (on: Followed, run: string, f: Following, now: number) => {
  f.usedAt = now
  if (on.runs.get(run) !== f) return
  on.runs.delete(run)
  on.runs.set(run, f)
}

/** How long a run is followed after its last use (the command routes' settings). */
type FollowSettings = typeof CommandRouteSettings.Tag.Identifier

/**
 * The follower of run `run`'s records, made when there is none, held for `use` (so no sweep
 * closes it meanwhile) and used once more when `use` is over.
 */
const holding = <A, E, R>(
  run: string,
  use: (follower: Kv.KvFollower<CommandRecord>) => Effect.Effect<A, E, R>,
): Effect.Effect<A, E | NatsError, R | Nats | Storage | FollowSettings> =>
  Effect.flatMap(Effect.all([Nats, commands, CommandRouteSettings.Tag]), ([nats, kv, settings]) => {
    let on = followed.get(nats.connection)
    if (on === undefined) {
      const [least, most] = IDLE_MS_RANGE
      on = {
        runs: new Map(),
        idleMs: Math.min(most, Math.max(least, settings.followIdleMs)),
        sweeper: undefined,
      }
      followed.set(nats.connection, on)
    }
    const at = on
    // Taken and let go as a resource: a request interrupted between the two still lets go.
    const held = (f: Following) =>
      Effect.acquireUseRelease(
        Effect.sync(() => {
          f.holds++
        }),
        () => use(f.follower),
        () =>
          Effect.sync(() => {
            f.holds--
            touch(at, run, f, Date.now())
          }),
      )
    const known = at.runs.get(run)
    if (known?.follower.open() === true) {
      touch(at, run, known, Date.now())
      return held(known)
    }
    return Effect.flatMap(kv.follow(kvKeys.commandsOf(run)), (follower) => {
      // Made meanwhile by another request: one follower per run.
      const other = at.runs.get(run)
      if (other?.follower.open() === true) {
        follower.close()
        return held(other)
      }
      other?.follower.close()
      at.runs.delete(run)
      const made: Following = { follower, usedAt: Date.now(), holds: 0 }
      at.runs.set(run, made)
      if (at.sweeper === undefined) {
        at.sweeper = setInterval(() => sweep(at, Date.now()), at.idleMs / 4)
        at.sweeper.unref()
      }
      made.holds++
      sweep(at, made.usedAt)
      made.holds--
      return held(made)
    })
  })

/** Follows run `run`'s records from now on, so the waits on the commands asked for after it need no read. */
export const follow = (run: string): Effect.Effect<void, NatsError, Nats | Storage | FollowSettings> =>
  holding(run, () => Effect.void)

// The first value of the record at `seq` that `test` accepts, current or to come, up to `timeoutMs`.
const awaitRecord = (
  run: string,
  seq: number,
  test: (record: CommandRecord) => boolean,
  timeoutMs: number,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage | FollowSettings> =>
  holding(run, (follower) => follower.awaitValueUpTo(kvKeys.command(run, seq), test, timeoutMs))

/** Completes with the record at `seq` once it has ended (at once when it already has); waits as long as it takes. */
export const awaitEnded = (
  run: string,
  seq: number,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage | FollowSettings> =>
  awaitRecord(run, seq, isEnded, Number.POSITIVE_INFINITY)

/**
 * Command `cid` (at sequence `seq`) once it has ended, or as it is after `timeoutMs`; none when
 * `seq` holds no record of that command. The run's follower serves the wait: the record is read
 * only when none of its writes came to it (the command was created elsewhere, or long ago), and
 * the last value seen is the answer when the time runs out. The long polls of
 * `GET …/commands/{cid}?wait=` and `POST …/commands?wait=`.
 */
export const endedOrLatest = (
  run: string,
  seq: number,
  cid: string,
  timeoutMs: number,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage | FollowSettings> =>
  Effect.gen(function* () {
    let latest: CommandRecord | undefined
    const ended = yield* awaitRecord(
      run,
      seq,
      (r) => {
        latest = r
        return r.id !== cid || isEnded(r)
      },
      timeoutMs,
    )
    return Option.filter(
      Option.orElse(ended, () => Option.fromNullable(latest)),
      (r) => r.id === cid,
    )
  })

/** The run's records changed after revision `since`, oldest change first, about `maxBytes` of JSON at most. */
export const changedAfter = (
  run: string,
  since: number,
  maxBytes: number,
): Effect.Effect<KvChangesRead<CommandRecord>, Fails, Nats | Storage> =>
  Effect.flatMap(Storage, ({ names }) =>
    changesAfter(names.kv.commands.name, CommandRecordSchema, kvKeys.commandsOf(run), since, maxBytes),
  )

/** Completes at the first write to any record of the run after revision `since`; waits as long as it takes. */
export const awaitChangeAfter = (run: string, since: number): Effect.Effect<void, Fails, Nats | Storage> =>
  Effect.gen(function* () {
    const kv = yield* commands
    yield* kv.watch(kvKeys.commandsOf(run), { fromRevision: since + 1 }).pipe(Stream.take(1), Stream.runDrain)
  })

/** Completes once the run's stored state is other than `state`; waits as long as it takes. */
export const awaitRunStateOtherThan = (
  account: string,
  run: string,
  state: RunState,
): Effect.Effect<void, Fails, Nats | Storage> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const runs = yield* Kv.make(names.kv.runs.name, StoredRun)
    yield* runs.awaitValue(kvKeys.run(account, run), (r) => r.state !== state)
  })
