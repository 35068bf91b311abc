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
import type { Nats, NatsError } from "../../core/Nats.ts"
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
// before asking for it). A follower is kept a minute after its last use (`followIdleMs`), 1,024 at
// most (the least recently used goes first, never one a wait is using); one whose subscription
// ended is made again.
const FOLLOWERS_MAX = 1_024

interface Following {
  readonly follower: Kv.KvFollower<CommandRecord>
  usedAt: number
  waits: number
}

/** The runs followed on one connection (its view of the bucket), least recently used first. */
interface Followed {
  readonly runs: Map<string, Following>
  readonly idleMs: number
  sweeper: ReturnType<typeof setInterval> | undefined
}

const followed = new WeakMap<Kv.Kv<CommandRecord>, Followed>()

// Closes the followers idle for a minute, and the least recently used past the most kept.
const sweep = (on: Followed, now: number) => {
  for (const [run, f] of on.runs) {
    if (f.waits > 0) continue
    if (on.runs.size <= FOLLOWERS_MAX && now - f.usedAt < on.idleMs && f.follower.open()) break
    f.follower.close()
    on.runs.delete(run)
  }
  if (on.runs.size === 0 && on.sweeper !== undefined) {
    clearInterval(on.sweeper)
    on.sweeper = undefined
  }
}

/** The follower of run `run`'s records, made when there is none (before a command is asked for). */
/** How long a run is followed after its last use (the command routes' settings). */
type FollowSettings = typeof CommandRouteSettings.Tag.Identifier

const following = (run: string): Effect.Effect<Following, NatsError, Nats | Storage | FollowSettings> =>
  Effect.flatMap(Effect.zip(commands, CommandRouteSettings.Tag), ([kv, settings]) => {
    let on = followed.get(kv)
    if (on === undefined) {
      on = { runs: new Map(), idleMs: settings.followIdleMs, sweeper: undefined }
      followed.set(kv, on)
    }
    const at = on
    const now = Date.now()
    const known = at.runs.get(run)
    if (known?.follower.open() === true) {
      known.usedAt = now
      at.runs.delete(run)
      at.runs.set(run, known)
      return Effect.succeed(known)
    }
    return Effect.map(kv.follow(kvKeys.commandsOf(run)), (follower) => {
      // Made meanwhile by another request: one follower per run.
      const other = at.runs.get(run)
      if (other?.follower.open() === true) {
        follower.close()
        return other
      }
      other?.follower.close()
      at.runs.delete(run)
      const made: Following = { follower, usedAt: now, waits: 0 }
      at.runs.set(run, made)
      sweep(at, now)
      if (at.sweeper === undefined) {
        at.sweeper = setInterval(() => sweep(at, Date.now()), at.idleMs / 4)
        at.sweeper.unref()
      }
      return made
    })
  })

/** Follows run `run`'s records from now on, so the waits on the commands asked for after it need no read. */
export const follow = (run: string): Effect.Effect<void, NatsError, Nats | Storage | FollowSettings> =>
  Effect.asVoid(following(run))

// The first value of the record at `seq` that `test` accepts, current or to come, up to `timeoutMs`.
const awaitRecord = (
  run: string,
  seq: number,
  test: (record: CommandRecord) => boolean,
  timeoutMs: number,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage | FollowSettings> =>
  Effect.flatMap(following(run), (f) => {
    f.waits++
    return f.follower.awaitValueUpTo(kvKeys.command(run, seq), test, timeoutMs).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          f.waits--
          f.usedAt = Date.now()
        }),
      ),
    )
  })

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
