/**
 * "What changed after revision N": the current values of the keys of a KV bucket matching a
 * filter whose last write is newer than N, in revision order, read up to the bucket's current end.
 *
 * A bucket keeping one value per key (`history: 1`, as every bucket of ours) stores only each
 * key's last write, so its stream read from sequence N+1 is exactly that set, and a reader that
 * remembers the last revision it saw can ask again for the rest — a change counter for free. The
 * end is the stream's last message on the filter (a wildcard `last_by_subj` get), so the read stops
 * there instead of waiting for writes to come; a `Kv.watch` cannot tell when it has caught up.
 *
 * The bucket's stream and subjects are `@nats-io/kv`'s layout (`KV_<bucket>`, `$KV.<bucket>.<key>`),
 * the same that `Storage.kvStreamConfig` creates.
 */
import { Effect, Option, Schema, Stream } from "effect"
import { KvValueInvalid } from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { kvStreamConfig } from "./Storage.ts"
import { getMessage, readSubject } from "./StreamRead.ts"

/** One key's current value with the revision of its last write. */
export interface KvChangeEntry<A> {
  readonly key: string
  readonly value: A
  readonly revision: number
}

/** Values changed after a revision, and where the bucket's history of the filter ended. */
export interface KvChangesRead<A> {
  /** In revision order; deleted keys are left out. */
  readonly entries: ReadonlyArray<KvChangeEntry<A>>
  /** The last revision read (that of the last entry, or of a deletion after it), or `after` when none. */
  readonly through: number
  /** Whether the read stopped at `maxBytes` before the end. */
  readonly more: boolean
}

const operationHeader = "KV-Operation"

/** Reads past the first end, when keys were written again during it (see `changesAfter`). */
const EXTRA_ROUNDS = 3

/**
 * The values of keys matching `filter` (subject style: `run_x.*`) in bucket `bucket` whose last
 * write has a revision above `after`, oldest change first. Values are taken while their JSON adds
 * up to at most `maxBytes`, but always at least one, so a reader always moves on.
 */
export const changesAfter = <A, I>(
  bucket: string,
  schema: Schema.Schema<A, I>,
  filter: string,
  after: number,
  maxBytes: number,
): Effect.Effect<KvChangesRead<A>, NatsError | KvValueInvalid, Nats> =>
  Effect.gen(function* () {
    const stream = kvStreamConfig({ name: bucket, maxAgeMs: 0, history: 1 }).name
    const prefix = `$KV.${bucket}.`
    const subject = `${prefix}${filter}`
    const last = yield* getMessage(stream, { lastOf: subject })
    if (Option.isNone(last) || last.value.seq <= after) return { entries: [], through: after, more: false }
    const decode = Schema.decode(Schema.parseJson(schema))
    const text = new TextDecoder()

    const entries: Array<KvChangeEntry<A>> = []
    let taken = 0
    let bytes = 0
    let through = after
    let more = false
    // Writes on the filter past the last message read, as the server counted when it delivered it.
    let pendingAfter = 0
    const readUpTo = (end: number) =>
      readSubject(stream, subject, through + 1, end).pipe(
        Stream.takeWhile((m) => {
          const put = m.header(operationHeader) === undefined
          if (put && taken > 0 && bytes + m.data.length > maxBytes) {
            more = true
            return false
          }
          // A deletion is passed over, but counted as read, so the next read starts after it.
          through = m.seq
          pendingAfter = m.pending ?? 0
          if (put) {
            taken += 1
            bytes += m.data.length
          }
          return true
        }),
        Stream.filter((m) => m.header(operationHeader) === undefined),
        Stream.mapEffect((m) => {
          const key = m.subject.slice(prefix.length)
          return decode(text.decode(m.data)).pipe(
            Effect.map((value) => ({ key, value, revision: m.seq })),
            Effect.mapError(
              (e) => new KvValueInvalid({ bucket, key, direction: "decode", message: e.message }),
            ),
          )
        }),
        Stream.runForEach((entry) => Effect.sync(() => entries.push(entry))),
      )
    // A key written again while it was being read loses its earlier revision at once (one value
    // per key), and its new one lies past the end the read was given; the server then counts it
    // pending when it delivers the last message. Read on to the filter's new end until nothing is
    // (a few rounds; under writes that never stop, the rest is the next read's). A read no write
    // overtook asks nothing more.
    let end = last.value.seq
    for (let round = 1; ; round++) {
      pendingAfter = 0
      yield* readUpTo(end)
      if (more || pendingAfter === 0 || round > EXTRA_ROUNDS) break
      const now = yield* getMessage(stream, { lastOf: subject })
      if (Option.isNone(now) || now.value.seq <= end) break
      end = now.value.seq
    }
    // A key read in an earlier round and written again since is answered once, at its latest.
    const seen = new Set<string>()
    const latest: Array<KvChangeEntry<A>> = []
    for (let i = entries.length - 1; i >= 0; i--) {
      const entry = entries[i] as KvChangeEntry<A>
      if (seen.has(entry.key)) continue
      seen.add(entry.key)
      latest.push(entry)
    }
    return { entries: latest.reverse(), through, more }
  })
