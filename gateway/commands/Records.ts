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
 *   missed: one key with `Kv.awaitValue` (a core subscription, then the current value), the changes
 *   of a run with a KV watch from revision N+1. Callers bound waits with a timeout; interrupting
 *   one (the client went away) unsubscribes.
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

/** Completes with the record at `seq` once it has ended (at once when it already has); waits as long as it takes. */
export const awaitEnded = (
  run: string,
  seq: number,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage> =>
  Effect.gen(function* () {
    const kv = yield* commands
    return Option.some(yield* kv.awaitValue(kvKeys.command(run, seq), isEnded))
  })

/**
 * Listens to the writes of the run's records from now on, while `use` runs: made before a command
 * is asked for, its record's writes all come to `endedOrLatest`, which then need not read it
 * (`POST …/commands?wait=`).
 */
export const listen = <B, E, R>(
  run: string,
  use: (listener: RecordsListener) => Effect.Effect<B, E, R>,
): Effect.Effect<B, Fails | E, Nats | Storage | R> =>
  Effect.flatMap(commands, (kv) => kv.listen(kvKeys.commandsOf(run), use))

export type RecordsListener = Kv.KvListener<CommandRecord>

/**
 * Command `cid` (at sequence `seq`) once it has ended, or as it is after `timeoutMs`; none when
 * `seq` holds no record of that command. One read serves as the existence check and the start of
 * the wait (subscribed before it), and the last value read is the answer when the time runs out;
 * with a `listener` made before the command was asked for, the record's writes that came to it
 * make the read needless. The long polls of `GET …/commands/{cid}?wait=` and `POST …/commands?wait=`.
 */
export const endedOrLatest = (
  run: string,
  seq: number,
  cid: string,
  timeoutMs: number,
  listener?: RecordsListener,
): Effect.Effect<Option.Option<CommandRecord>, Fails, Nats | Storage> =>
  Effect.gen(function* () {
    const kv = listener ?? (yield* commands)
    let latest: CommandRecord | undefined
    const ended = yield* kv.awaitValueUpTo(
      kvKeys.command(run, seq),
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
