import { expect, layer } from "@effect/vitest"
import { Chunk, Effect, Fiber, Stream } from "effect"
import type { CommandRecord } from "../schema/Command.ts"
import type { OperatorEvent } from "../schema/OperatorEvent.ts"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import * as OperatorEvents from "./OperatorEvents.ts"

const runState = (account: string, run: string, state: "queued" | "running" | "failed"): OperatorEvent => ({
  type: "run.state",
  v: 1,
  at: "2026-01-01T00:00:00.000Z",
  account,
  run,
  state,
  ...(state === "failed" ? { failure: "timeout" as const } : {}),
})

layer(layerAll())("OperatorEvents", (it) => {
  it.effect("an event published twice (a retried writer) is stored once; stored reads a run's in order", () =>
    Effect.gen(function* () {
      const [account, run] = [uniqueName("acc"), uniqueName("run")]
      expect(yield* OperatorEvents.stored(account, run)).toEqual([])
      yield* OperatorEvents.publish(runState(account, run, "queued"))
      yield* OperatorEvents.publish(runState(account, run, "queued"))
      yield* OperatorEvents.publish(runState(account, run, "running"))
      yield* OperatorEvents.publish(runState(account, run, "failed"))
      expect(
        (yield* OperatorEvents.stored(account, run)).map((e) => e.type === "run.state" && e.state),
      ).toEqual(["queued", "running", "failed"])
    }),
  )

  it.effect("live follows one account's events from now on, not another's", () =>
    Effect.gen(function* () {
      const [mine, other] = [uniqueName("acc"), uniqueName("acc")]
      const fiber = yield* Effect.fork(
        Stream.runCollect(Stream.take(OperatorEvents.live({ account: mine }), 2)).pipe(Effect.scoped),
      )
      // Published until the watcher has both (it subscribes a moment after the fork).
      let n = 0
      while (fiber.unsafePoll() === null && n < 200) {
        yield* OperatorEvents.publish(runState(other, uniqueName("run"), "queued"))
        yield* OperatorEvents.publish(runState(mine, `run${n++}`, "queued"))
        // Real time (the test clock would stand still).
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 20)))
      }
      const seen = Chunk.toReadonlyArray(yield* Fiber.join(fiber))
      expect(seen.map((e) => e.account)).toEqual([mine, mine])
    }),
  )

  it.effect("commandEnded: only an ended record of a known account makes an event", () =>
    Effect.sync(() => {
      const record = {
        id: "cmd_1",
        run: "run_1",
        kind: "bash",
        source: "caller",
        sequence: 3,
        state: "running",
        created_at: "2026-01-01T00:00:00.000Z",
        arguments: { command: "true" },
      } as unknown as CommandRecord
      expect(OperatorEvents.commandEnded("acc_1", record)).toBeUndefined()
      const ended = { ...record, state: "failed", ended_at: "2026-01-01T00:00:01.000Z" } as CommandRecord
      expect(OperatorEvents.commandEnded("", ended)).toBeUndefined()
      expect(OperatorEvents.commandEnded("acc_1", ended)).toEqual({
        type: "command.ended",
        v: 1,
        at: "2026-01-01T00:00:01.000Z",
        account: "acc_1",
        run: "run_1",
        command: "cmd_1",
        sequence: 3,
        kind: "bash",
        source: "caller",
        state: "failed",
      })
    }),
  )
})
