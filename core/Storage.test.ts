import { expect, layer } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { kvBuckets, objectStores, storageNames, streams } from "../schema/Subjects.ts"
import { layerWithNats, NatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"
import * as Kv from "./Kv.ts"
import { attempt, layerUrl, Nats } from "./Nats.ts"
import * as Storage from "./Storage.ts"

const DAY_NS = 24 * 60 * 60 * 1e9

const streamInfo = (name: string) =>
  Effect.flatMap(Nats, ({ jsm }) => attempt(`info ${name}`, () => jsm.streams.info(name)))

layer(layerWithNats)("Storage.ensure", (it) => {
  it.effect("creates every bucket, stream and object store with its retention", () =>
    Effect.gen(function* () {
      const names = storageNames(uniquePrefix())
      yield* Storage.ensure(names)
      const mailbox = (yield* streamInfo(names.streams.MAILBOX.name)).config
      expect(mailbox).toMatchObject({
        retention: "workqueue",
        subjects: [`${names.prefix}.mb.>`, `${names.prefix}.mbt.>`],
        allow_msg_schedules: true,
        allow_msg_ttl: true,
        max_age: 0,
      })
      expect((yield* streamInfo(names.streams.OUTPUT.name)).config.max_age).toBe(30 * DAY_NS)
      expect((yield* streamInfo(names.streams.EVENTS.name)).config.max_age).toBe(30 * DAY_NS)
      expect((yield* streamInfo(names.streams.LEDGER.name)).config).toMatchObject({
        max_age: 400 * DAY_NS,
        deny_delete: true,
        deny_purge: true,
        retention: "limits",
      })
      expect((yield* streamInfo(`KV_${names.kv.invites.name}`)).config.max_age).toBe(7 * DAY_NS)
      expect((yield* streamInfo(`KV_${names.kv.runs.name}`)).config.max_age).toBe(30 * DAY_NS)
      expect((yield* streamInfo(`KV_${names.kv.accounts.name}`)).config.max_age).toBe(0)
      expect((yield* streamInfo(`KV_${names.kv.uploads.name}`)).config.max_age).toBe(30 * DAY_NS)
      expect((yield* streamInfo(`KV_${names.kv.hosts.name}`)).config.max_age).toBe(60 * 1_000_000_000)
      for (const o of ["inputs", "outputs", "logs", "files"] as const) {
        expect((yield* streamInfo(`OBJ_${names.objects[o].name}`)).config.max_age).toBe(30 * DAY_NS)
      }
      const { jsm } = yield* Nats
      const all = yield* attempt("names", async () => {
        const out: Array<string> = []
        for await (const n of jsm.streams.names()) if (n.includes(names.prefix)) out.push(n)
        return out
      })
      expect(all).toHaveLength(kvBuckets.length + streams.length + objectStores.length)
    }),
  )

  it.effect("running twice, and concurrently from two connections, succeeds with the same config", () =>
    Effect.gen(function* () {
      const server = yield* NatsServer
      const names = storageNames(uniquePrefix())
      const other = (e: Effect.Effect<void, unknown, Nats>) =>
        e.pipe(Effect.provide(layerUrl(server.url, "other")))
      yield* Effect.all([Storage.ensure(names), other(Storage.ensure(names)), Storage.ensure(names)], {
        concurrency: "unbounded",
      })
      yield* Storage.ensure(names)
      expect((yield* streamInfo(names.streams.LEDGER.name)).config.max_age).toBe(400 * DAY_NS)
      const kv = yield* Kv.make(names.kv.runs.name, Schema.Unknown)
      expect(yield* kv.keys()).toEqual([])
    }),
  )

  it.effect("brings a stream whose retention was changed back to the configured one", () =>
    Effect.gen(function* () {
      const names = storageNames(uniquePrefix())
      yield* Storage.ensure(names)
      const { jsm } = yield* Nats
      const name = names.streams.OUTPUT.name
      yield* attempt("update", () => jsm.streams.update(name, { max_age: DAY_NS }))
      expect((yield* streamInfo(name)).config.max_age).toBe(DAY_NS)
      yield* Storage.ensure(names)
      expect((yield* streamInfo(name)).config.max_age).toBe(30 * DAY_NS)
    }),
  )

  it.effect("every bucket republishes its stored writes; a bucket made without that gets it", () =>
    Effect.gen(function* () {
      const names = storageNames(uniquePrefix())
      const { jsm } = yield* Nats
      // A bucket as a version before republishing made it.
      const { republish: _, ...older } = Storage.kvStreamConfig(names.kv.commands)
      yield* attempt("add", () => jsm.streams.add(older))
      expect((yield* streamInfo(older.name)).config.republish).toBeUndefined()
      yield* Storage.ensure(names)
      for (const b of kvBuckets) {
        const bucket = names.kv[b].name
        expect((yield* streamInfo(`KV_${bucket}`)).config.republish).toEqual({
          src: `$KV.${bucket}.>`,
          dest: `${Kv.republishedPrefix(bucket)}>`,
        })
      }
    }),
  )

  it.effect("the layer provides the names of the storage it ensured", () =>
    Effect.gen(function* () {
      const prefix = uniquePrefix()
      const storage = yield* Effect.provide(Storage.Storage, Storage.layerPrefix(prefix).pipe(Layer.orDie))
      expect(storage.names.prefix).toBe(prefix)
      expect((yield* streamInfo(storage.names.streams.MAILBOX.name)).config.name).toBe(`${prefix}_MAILBOX`)
    }),
  )
})
