/** Helpers for tests of the host agent's run-level parts on real machines. */
import { randomBytes } from "node:crypto"
import { Context, Effect, Exit, Layer, Scope } from "effect"
import { BasesSettings } from "../bases/Bases.ts"
import { MachineDriver, type MachineDriverService, type SizeName } from "../machines/MachineDriver.ts"
import * as Capacity from "../registry/Capacity.ts"
import { Host } from "../registry/HostSettings.ts"
import * as WarmPool from "./WarmPool.ts"

/** A host id of its own for a test file: the machines it owns are that file's. */
export const testHostId = () => `host_${randomBytes(13).toString("hex").slice(0, 26)}`

/** A warm pool on `driver` as host `host`, with the capacity it fits to, until `close`. */
export interface TestPool {
  readonly pool: WarmPool.WarmPoolService
  readonly capacity: Capacity.CapacityService
  readonly close: () => Promise<void>
}

/**
 * A pool of `machines` machines of the slim test base per size of `sizes` on a host of `vcpus`
 * (and 64 GiB), alone: no host actor places runs, the test takes machines and reserves room itself.
 */
export const startWarmPool = async (options: {
  readonly driver: MachineDriverService
  readonly host: string
  readonly machines: number
  readonly vcpus: number
  readonly sizes: ReadonlyArray<SizeName>
}): Promise<TestPool> => {
  const memoryMib = 64 * 1024
  const scope = Effect.runSync(Scope.make())
  const capacity = await Effect.runPromise(Capacity.make({ vcpus: options.vcpus, memory_mib: memoryMib }))
  const layer = WarmPool.layerWith({ machines: options.machines, sizes: options.sizes }).pipe(
    Layer.provide(
      Layer.mergeAll(
        Layer.succeed(MachineDriver, options.driver),
        Layer.succeed(Capacity.Capacity, capacity),
        Layer.succeed(Host, {
          id: options.host as never,
          driver: "namespace",
          vcpus: options.vcpus,
          memoryMib,
        }),
        BasesSettings.layer({ recipes: ["debian-bookworm-slim"] }),
      ),
    ),
  )
  const context = await Effect.runPromise(Layer.buildWithScope(layer, scope))
  return {
    pool: Context.get(context, WarmPool.WarmPool),
    capacity,
    close: () => Effect.runPromise(Scope.close(scope, Exit.void)),
  }
}
