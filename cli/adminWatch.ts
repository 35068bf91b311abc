/**
 * `hangar admin watch [--account A] [--run R] [--count N]`: the operator events
 * (`schema/OperatorEvent.ts`) published from now on, one JSON object a line on stdout (a compact
 * line each when stdout is a terminal), until interrupted or, with `--count`, after N events.
 * The same as `nats sub 'evt.<A|*>.<R|*>'` with the standard CLI.
 *
 * `hangar admin watch --hosts [--count N]`: the hosts instead, from KV `hosts`: each host's record as
 * it is now, then every change (a heartbeat, room taken or given back, a base built), one line
 * each: `{type: "host", host, live, heartbeat_at, vcpus, free_vcpus, memory_mib, free_memory_mib,
 * machines, bases, building}`, or `{type: "host.removed", host}`. The same as
 * `nats kv watch <prefix>_hosts`.
 */
import { Effect, Stream } from "effect"
import * as Connected from "../core/Connected.ts"
import * as Kv from "../core/Kv.ts"
import * as OperatorEvents from "../core/OperatorEvents.ts"
import { Storage } from "../core/Storage.ts"
import { HostRecord, isLive } from "../schema/Host.ts"
import type { OperatorEvent } from "../schema/OperatorEvent.ts"

/** What to follow: every account and run when not given; at most `count` events when given. */
export interface WatchOptions {
  readonly account?: string | undefined
  readonly run?: string | undefined
  readonly count?: number | undefined
}

/** One event as a terminal line: time, type, account, run, then what changed. */
export const compact = (e: OperatorEvent): string =>
  e.type === "run.state"
    ? `${e.at}  run.state      ${e.account}  ${e.run}  ${e.state}${e.failure === undefined ? "" : ` (${e.failure})`}`
    : `${e.at}  command.ended  ${e.account}  ${e.run}  #${e.sequence} ${e.kind} ${e.source} ${e.state}`

/** One line of `--hosts`: a host's record as operators read it, or its removal. */
export type HostLine =
  | {
      readonly type: "host"
      readonly host: string
      readonly live: boolean
      readonly heartbeat_at: string
      readonly vcpus: number
      readonly free_vcpus: number
      readonly memory_mib: number
      readonly free_memory_mib: number
      readonly machines: number
      readonly bases: ReadonlyArray<string>
      readonly building: ReadonlyArray<string>
    }
  | { readonly type: "host.removed"; readonly host: string }

const hostLine = (change: Kv.KvChange<HostRecord>, now: number): HostLine =>
  change._tag === "Deleted"
    ? { type: "host.removed", host: change.key }
    : {
        type: "host",
        host: change.value.id,
        live: isLive(change.value, now),
        heartbeat_at: change.value.heartbeat_at,
        vcpus: change.value.vcpus,
        free_vcpus: change.value.free_vcpus,
        memory_mib: change.value.memory_mib,
        free_memory_mib: change.value.free_memory_mib,
        machines: change.value.machines.length,
        bases: change.value.bases.map((b) => b.name),
        building: change.value.building ?? [],
      }

/** A host line for a terminal. */
export const compactHost = (h: HostLine): string =>
  h.type === "host.removed"
    ? `host.removed   ${h.host}`
    : `${h.heartbeat_at}  host  ${h.host}  ${h.live ? "live" : "stale"}  vcpus ${h.free_vcpus}/${h.vcpus} free  memory ${h.free_memory_mib}/${h.memory_mib} MiB free  ${h.machines} machines${h.building.length > 0 ? `  building ${h.building.join(",")}` : ""}`

/** Prints the items of `items` as they come (at most `count`); answers how many it printed. */
const printAll = <A, E, R>(
  items: Stream.Stream<A, E, R>,
  count: number | undefined,
  line: (a: A, tty: boolean) => string,
  out: (line: string) => void,
) =>
  Effect.gen(function* () {
    const tty = process.stdout.isTTY === true
    let printed = 0
    yield* Stream.runForEach(count === undefined ? items : Stream.take(items, count), (a) =>
      Effect.sync(() => {
        printed++
        out(line(a, tty))
      }),
    )
    return printed
  })

/** Prints the events as they come; ends (answering how many it printed) only with `count`. */
export const watch = (options: WatchOptions, out: (line: string) => void) =>
  printAll(
    OperatorEvents.live({ account: options.account, run: options.run }),
    options.count,
    (e, tty) => (tty ? compact(e) : JSON.stringify(e)),
    out,
  ).pipe(Effect.scoped, Effect.provide(Connected.layerFromEnv))

/** Prints every host as it is, then each change; ends only with `count`. */
export const watchHosts = (count: number | undefined, out: (line: string) => void) =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const kv = yield* Kv.make(names.kv.hosts.name, HostRecord)
    return yield* printAll(
      kv.watch(),
      count,
      (change, tty) => {
        const h = hostLine(change, Date.now())
        return tty ? compactHost(h) : JSON.stringify(h)
      },
      out,
    )
  }).pipe(Effect.scoped, Effect.provide(Connected.layerFromEnv))
