/**
 * Reading an actor's stored record (state, last applied sequence, outbox, timers, last failure)
 * directly from KV `actors`, for tests and operators. Only the owning worker writes it.
 */
import { Effect, Option } from "effect"
import type { AnyActor, StateOf } from "../../schema/actors/Actor.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import * as Kv from "../Kv.ts"
import type { Nats } from "../Nats.ts"
import { Storage } from "../Storage.ts"
import { type ActorRecord, recordSchema } from "./Record.ts"

/** The stored record of actor `id`, or none if it has never handled a message. */
export const read = <A extends AnyActor>(actor: A, id: string) =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const kv = yield* Kv.make(names.kv.actors.name, recordSchema(actor))
    const entry = yield* kv.get(kvKeys.actor(actor.name, id))
    return Option.map(entry, (e) => e.value as ActorRecord<StateOf<A>>)
  }) satisfies Effect.Effect<unknown, unknown, Nats | Storage>
