/**
 * Which worker runs which agent loop (see `Loop.ts` for the loop itself).
 *
 * Every actor worker runs one supervisor. It watches KV `agents`: the `r.<run>` records (a run
 * whose agent should be working, written by the run actor) and the `l.<run>` leases
 * `{owner, expiresAt}`. Every `renewMs` it renews the leases it holds (compare-and-set on the
 * revision it wrote; a lease it cannot renew in time, or finds taken, stops that loop), then claims
 * runs whose lease is missing or expired, up to its fair share (the runs over the live actor
 * workers of `core/actors/Leases.ts`, rounded up), and starts their loops. A dead worker's
 * leases expire and its runs are claimed by the others, whose loops resume from the persisted
 * conversation. A loop that failed (the bus, a bad record) gives its lease back and is claimed
 * again at a next tick; one replaced by another owner (`StaleLoop`) just stops. Running loops are
 * not rebalanced: a loop moves only when its worker stops or dies (a new worker takes new runs).
 *
 * When `r.<run>` is deleted (the run ended) the owner interrupts the loop and removes the lease
 * and the conversation. Closing the supervisor's scope (a graceful stop) interrupts its loops and
 * gives their leases back so others take over at once; a killed worker's leases simply expire.
 */
import { Cause, Clock, Context, Effect, Exit, Fiber, Layer, Option, Schedule, Scope, Stream } from "effect"
import * as Leases from "../../core/actors/Leases.ts"
import { Mailbox } from "../../core/actors/Mailbox.ts"
import { Worker } from "../../core/actors/Worker.ts"
import { Functions } from "../../core/Functions.ts"
import { Nats } from "../../core/Nats.ts"
import { Providers } from "../../core/Providers.ts"
import { Seal } from "../../core/Seal.ts"
import { Secrets } from "../../core/Secrets.ts"
import { Storage } from "../../core/Storage.ts"
import { Chat } from "../../core/vendors/Chat.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import * as Loop from "./Loop.ts"
import { AgentSettings } from "./Settings.ts"
import * as Store from "./Store.ts"

export interface AgentSupervisorService {
  /** The runs whose loops this worker holds now. */
  readonly owned: Effect.Effect<ReadonlyArray<string>>
}

/** The agent supervisor of this worker. */
export class AgentSupervisor extends Context.Tag("hangar/actors/AgentSupervisor")<
  AgentSupervisor,
  AgentSupervisorService
>() {}

interface Held {
  revision: number
  deadline: number
  readonly fiber: Fiber.RuntimeFiber<Loop.LoopEnd, unknown>
}

const runOf = (key: string) => key.slice(2)

/** Starts the supervisor in the current scope. */
export const make = Effect.gen(function* () {
  const nats = yield* Nats
  const storage = yield* Storage
  const settings = yield* AgentSettings.Tag
  const worker = yield* Worker
  const owner = worker.id
  const names = storage.names
  const views = yield* Store.open(names.kv.agents.name)
  const presence = yield* Leases.open(names.kv.leases.name)
  const deps: Loop.LoopDeps = {
    nats,
    storage,
    seal: yield* Seal,
    secrets: yield* Secrets,
    functions: yield* Functions,
    providers: yield* Providers,
    chat: yield* Chat,
    mailbox: yield* Mailbox,
    settings,
    views,
    toolCa: yield* Loop.loadToolCa(settings).pipe(Effect.orDie),
  }
  const margin = Math.max(1, Math.floor(settings.leaseMs / 10))
  const active = new Map<string, Store.AgentRun>()
  const seen = new Map<string, { readonly value: Store.AgentLease; readonly revision: number }>()
  const held = new Map<string, Held>()
  const loops = yield* Scope.make()
  const provide = Effect.provideService(Nats, nats)

  const leaseKey = kvKeys.agentLease

  /** Stops the loop of `run` here; `release` gives the lease back, `clean` also removes the conversation. */
  const drop = (run: string, options: { readonly release: boolean; readonly clean?: boolean }) =>
    Effect.gen(function* () {
      const h = held.get(run)
      if (h === undefined) return
      held.delete(run)
      yield* Fiber.interrupt(h.fiber)
      if (options.clean) yield* Store.removeConversation(views, run).pipe(Effect.ignore)
      if (options.release)
        yield* views.leases.delete(leaseKey(run), { revision: h.revision }).pipe(Effect.ignore)
    })

  const start = (agent: Store.AgentRun, revision: number, expiresAt: number) =>
    Effect.gen(function* () {
      const fiber = yield* Effect.forkIn(
        Loop.run(deps, agent).pipe(
          Effect.tap((end) => Effect.logInfo("agent loop ended").pipe(Effect.annotateLogs({ end }))),
          Effect.tapErrorCause((cause) =>
            Cause.isInterruptedOnly(cause)
              ? Effect.void
              : Effect.logWarning("agent loop failed", Cause.squash(cause)).pipe(
                  Effect.annotateLogs({ run: agent.run }),
                ),
          ),
        ),
        loops,
      )
      held.set(agent.run, { revision, deadline: expiresAt - margin, fiber })
    })

  const tick = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const expiresAt = now + settings.leaseMs
    // Renew what we hold; a loop that failed gives its lease back (claimed again later).
    for (const [run, h] of [...held.entries()]) {
      const exit = yield* Fiber.poll(h.fiber)
      if (Option.isSome(exit) && Exit.isFailure(exit.value)) {
        const stale = Cause.failureOption(exit.value.cause).pipe(
          Option.exists((e) => (e as { _tag?: string })._tag === "StaleLoop"),
        )
        yield* drop(run, { release: !stale })
        continue
      }
      const renewed = yield* views.leases
        .update(leaseKey(run), { owner, expiresAt }, h.revision)
        .pipe(Effect.either)
      if (renewed._tag === "Right") {
        h.revision = renewed.right
        h.deadline = expiresAt - margin
      } else if (renewed.left._tag === "StateConflict" || now >= h.deadline) {
        yield* Effect.logWarning("agent lease lost").pipe(
          Effect.annotateLogs({ run, reason: renewed.left._tag }),
        )
        yield* drop(run, { release: false })
      }
    }
    // Claim runs nobody holds, up to our share.
    const waiting = [...active.values()].filter((a) => !held.has(a.run))
    if (waiting.length === 0) return
    const workers = yield* Leases.liveWorkers(presence, now)
    const share = Math.ceil(active.size / Math.max(1, workers.length))
    for (const agent of waiting) {
      if (held.size >= share) break
      const lease = seen.get(agent.run)
      if (lease !== undefined && lease.value.expiresAt > now && lease.value.owner !== owner) continue
      const claimed = yield* views.leases
        .update(leaseKey(agent.run), { owner, expiresAt }, lease?.revision ?? 0)
        .pipe(Effect.option)
      if (Option.isNone(claimed)) continue
      yield* Effect.logInfo("agent run claimed").pipe(Effect.annotateLogs({ run: agent.run, owner }))
      yield* start(agent, claimed.value, expiresAt)
    }
  }).pipe(
    Effect.catchAll((e) =>
      Effect.logWarning("agent supervisor tick failed").pipe(Effect.annotateLogs({ error: e._tag })),
    ),
    provide,
  )

  // Runs that should have a working agent.
  const runsWatch = views.runs.watch("r.*").pipe(
    Stream.runForEach((change) =>
      Effect.gen(function* () {
        const run = runOf(change.key)
        if (change._tag === "Put") {
          active.set(run, change.value)
          return
        }
        active.delete(run)
        if (held.has(run)) yield* drop(run, { release: true, clean: true })
      }),
    ),
  )
  // The leases as last written (a claim checks them; compare-and-set decides).
  const leasesWatch = views.leases.watch("l.*").pipe(
    Stream.runForEach((change) =>
      Effect.sync(() => {
        if (change._tag === "Put")
          seen.set(runOf(change.key), { value: change.value, revision: change.revision })
        else seen.delete(runOf(change.key))
      }),
    ),
  )
  const forever = <E>(watch: Effect.Effect<void, E>, what: string) =>
    watch.pipe(
      Effect.tapErrorCause((cause) => Effect.logWarning(`agent ${what} watch stopped`, Cause.squash(cause))),
      Effect.retry(Schedule.spaced(settings.renewMs)),
      provide,
    )

  yield* Effect.addFinalizer(() =>
    Effect.gen(function* () {
      yield* Effect.forEach([...held.keys()], (run) => drop(run, { release: true }), { discard: true })
      yield* Scope.close(loops, Exit.void)
    }).pipe(provide),
  )
  yield* Effect.forkScoped(forever(runsWatch, "runs"))
  yield* Effect.forkScoped(forever(leasesWatch, "leases"))
  yield* tick.pipe(Effect.repeat(Schedule.spaced(settings.renewMs)), Effect.forkScoped)
  yield* Effect.logInfo("agent supervisor started").pipe(Effect.annotateLogs({ worker: owner }))

  return { owned: Effect.sync(() => [...held.keys()].sort()) } satisfies AgentSupervisorService
})

/** The supervisor as a layer; its loops stop and their leases go back when the layer's scope closes. */
export const layer = Layer.scoped(AgentSupervisor, make)
