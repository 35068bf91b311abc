/**
 * Capacity: the host's budget of vCPUs and memory and the machines holding part of it. A placement
 * is accepted only while the size's vCPUs and memory both fit what is free; otherwise it gets
 * `NoRoom` (the scheduler keeps the run waiting). The accounting is pure (`reserveIn`,
 * `releaseIn`); the service keeps it in one `SubscriptionRef`, so concurrent placements are
 * serialized and can never overbook, and every change is seen by `changes` (the host record).
 */
import { Context, Data, Effect, Either, Layer, Stream, SubscriptionRef } from "effect"
import type { HostMachine, SizeName } from "../../schema/Host.ts"
import type { RunId } from "../../schema/Ids.ts"
import { sizes } from "../../schema/Limits.ts"
import { Host } from "./HostSettings.ts"

/** What all machines together may use. */
export interface Budget {
  readonly vcpus: number
  readonly memory_mib: number
}

/** What is left of the budget. */
export interface Free {
  readonly vcpus: number
  readonly memory_mib: number
}

/** The accounting state: the budget and the machines holding part of it, in order of placement. */
export interface CapacityState {
  readonly budget: Budget
  readonly machines: ReadonlyArray<HostMachine>
}

/** A placement accepted: the machine as held, and what is free after it. */
export interface Reserved {
  readonly machine: HostMachine
  readonly free: Free
}

/** A placement refused: `field` is the first resource that does not fit (vCPUs checked first). */
export class NoRoom extends Data.TaggedError("NoRoom")<{
  readonly machineId: string
  readonly size: SizeName
  readonly field: "vcpus" | "memory_mib"
  readonly needed: number
  readonly free: number
}> {}

/** An empty host with this budget. */
export const emptyState = (budget: Budget): CapacityState => ({ budget, machines: [] })

/** What is free in `state`. */
export const freeOf = (state: CapacityState): Free => ({
  vcpus: state.budget.vcpus - state.machines.reduce((n, m) => n + m.vcpus, 0),
  memory_mib: state.budget.memory_mib - state.machines.reduce((n, m) => n + m.memory_mib, 0),
})

/**
 * Reserves `size` for `machineId` in `state`. Reserving an id already held returns its existing
 * reservation unchanged (a redelivered placement does not count twice). On `NoRoom` the state is
 * returned as it was (the same object, so `changes` sees no change).
 */
export const reserveIn = (
  state: CapacityState,
  machineId: string,
  size: SizeName,
  run?: RunId,
): readonly [Either.Either<Reserved, NoRoom>, CapacityState] => {
  const held = state.machines.find((m) => m.id === machineId)
  if (held) return [Either.right({ machine: held, free: freeOf(state) }), state]
  const want = sizes[size]
  const free = freeOf(state)
  if (want.vcpus > free.vcpus)
    return [
      Either.left(new NoRoom({ machineId, size, field: "vcpus", needed: want.vcpus, free: free.vcpus })),
      state,
    ]
  if (want.memoryMib > free.memory_mib)
    return [
      Either.left(
        new NoRoom({ machineId, size, field: "memory_mib", needed: want.memoryMib, free: free.memory_mib }),
      ),
      state,
    ]
  const machine: HostMachine = {
    id: machineId,
    ...(run === undefined ? {} : { run }),
    size,
    vcpus: want.vcpus,
    memory_mib: want.memoryMib,
  }
  const next = { ...state, machines: [...state.machines, machine] }
  return [Either.right({ machine, free: freeOf(next) }), next]
}

/** Releases `machineId`'s reservation; returns whether it was held (the same state object when not). */
export const releaseIn = (state: CapacityState, machineId: string): readonly [boolean, CapacityState] =>
  state.machines.some((m) => m.id === machineId)
    ? [true, { ...state, machines: state.machines.filter((m) => m.id !== machineId) }]
    : [false, state]

/** The capacity service. */
export interface CapacityService {
  readonly budget: Budget
  /** Holds the size's vCPUs and memory for `machineId` if both fit, atomically; idempotent per id. */
  readonly reserve: (
    machineId: string,
    size: SizeName,
    run?: RunId,
  ) => Effect.Effect<Either.Either<Reserved, NoRoom>>
  /** Gives `machineId`'s resources back; idempotent, `false` when it held none. */
  readonly release: (machineId: string) => Effect.Effect<boolean>
  /** What is free now. */
  readonly free: Effect.Effect<Free>
  /** The current state. */
  readonly state: Effect.Effect<CapacityState>
  /** The current state, then each state after a change (an unchanged state is not repeated). */
  readonly changes: Stream.Stream<CapacityState>
}

/** The Tag of the host's capacity. */
export class Capacity extends Context.Tag("host-agent/Capacity")<Capacity, CapacityService>() {}

/** A capacity service over `budget`, with nothing reserved. */
export const make = (budget: Budget): Effect.Effect<CapacityService> =>
  Effect.map(SubscriptionRef.make(emptyState(budget)), (ref) => ({
    budget,
    reserve: (machineId, size, run) => SubscriptionRef.modify(ref, (s) => reserveIn(s, machineId, size, run)),
    release: (machineId) => SubscriptionRef.modify(ref, (s) => releaseIn(s, machineId)),
    free: Effect.map(SubscriptionRef.get(ref), freeOf),
    state: SubscriptionRef.get(ref),
    // A refused placement or an idempotent release hands back the same object: drop those.
    changes: ref.changes.pipe(Stream.changesWith((a, b) => a === b)),
  }))

/** The capacity of this host, over its resolved budget. */
export const layer: Layer.Layer<Capacity, never, Host> = Layer.effect(
  Capacity,
  Effect.flatMap(Host, (host) => make({ vcpus: host.vcpus, memory_mib: host.memoryMib })),
)
