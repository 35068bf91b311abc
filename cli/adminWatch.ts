/**
 * `hangar admin watch [--account A] [--run R] [--count N]`: the operator events
 * (`schema/OperatorEvent.ts`) published from now on, one JSON object a line on stdout (a compact
 * line each when stdout is a terminal), until interrupted or, with `--count`, after N events.
 * The same as `nats sub 'evt.<A|*>.<R|*>'` with the standard CLI.
 */
import { Effect, Stream } from "effect"
import * as Connected from "../core/Connected.ts"
import * as OperatorEvents from "../core/OperatorEvents.ts"
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

/** Prints the events as they come; ends (answering how many it printed) only with `count`. */
export const watch = (options: WatchOptions, out: (line: string) => void) =>
  Effect.gen(function* () {
    const tty = process.stdout.isTTY === true
    const events = OperatorEvents.live({ account: options.account, run: options.run })
    let printed = 0
    yield* Stream.runForEach(options.count === undefined ? events : Stream.take(events, options.count), (e) =>
      Effect.sync(() => {
        printed++
        out(tty ? compact(e) : JSON.stringify(e))
      }),
    )
    return printed
  }).pipe(Effect.scoped, Effect.provide(Connected.layerFromEnv))
