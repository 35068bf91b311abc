/**
 * The ledger: one append-only subject per account (`ledger.<account>` in stream `LEDGER`, kept 400
 * days). Entries are published with `Nats-Msg-Id` = the entry id, so a repeated append within the
 * stream's duplicate window is stored once; readers also keep only the first copy of an id, so a
 * repeat that came later still counts once.
 */
import { Effect, Option, Schema, Stream } from "effect"
import { type LedgerEntry, LedgerEntry as LedgerEntrySchema } from "../schema/Account.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"
import * as JsStream from "./Stream.ts"
import { getMessage, readSubject } from "./StreamRead.ts"

const encode = Schema.encodeSync(LedgerEntrySchema)
const decode = Schema.decodeUnknownOption(Schema.parseJson(LedgerEntrySchema))
const textDecoder = new TextDecoder()

/** Appends `entry` to its account's ledger (idempotent by entry id within the duplicate window). */
export const append = (entry: LedgerEntry): Effect.Effect<JsStream.PublishAck, NatsError, Nats | Storage> =>
  Effect.flatMap(Storage, ({ names }) =>
    JsStream.publish(names.subjects.ledger(entry.account), JSON.stringify(encode(entry)), {
      msgId: entry.id,
    }),
  )

/**
 * The account's entries in stream order, each id once, whose `effective_at` is at or after
 * `sinceMs` (all when absent). Reads the account's whole subject: fine for purchases and
 * adjustments; compute entries (later) may want a time index.
 */
export const read = (
  account: string,
  sinceMs?: number,
): Effect.Effect<ReadonlyArray<LedgerEntry>, NatsError, Nats | Storage> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const stream = names.streams.LEDGER.name
    const subject = names.subjects.ledger(account)
    const last = yield* getMessage(stream, { lastOf: subject })
    if (Option.isNone(last)) return []
    const seen = new Set<string>()
    const out: Array<LedgerEntry> = []
    yield* Stream.runForEach(readSubject(stream, subject, 1, last.value.seq), (m) =>
      Effect.sync(() => {
        const entry = decode(textDecoder.decode(m.data))
        if (Option.isNone(entry) || seen.has(entry.value.id)) return
        seen.add(entry.value.id)
        if (sinceMs === undefined || Date.parse(entry.value.effective_at) >= sinceMs) out.push(entry.value)
      }),
    )
    return out
  })

/** The sum of every entry of the account (what its balance must equal). */
export const sum = (account: string): Effect.Effect<number, NatsError, Nats | Storage> =>
  Effect.map(read(account), (entries) => entries.reduce((total, e) => total + e.amount_usd_nanos, 0))
