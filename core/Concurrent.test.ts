import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber } from "effect"
import { both } from "./Concurrent.ts"

describe("both", () => {
  it.effect("runs the two at the same time and answers both results in order", () =>
    Effect.gen(function* () {
      // Each waits for the other to have started: run one after the other, they would never end.
      const [aStarted, bStarted] = [yield* Deferred.make<void>(), yield* Deferred.make<void>()]
      const a = Effect.zipRight(
        Deferred.succeed(aStarted, undefined),
        Effect.as(Deferred.await(bStarted), "a"),
      )
      const b = Effect.zipRight(Deferred.succeed(bStarted, undefined), Effect.as(Deferred.await(aStarted), 2))
      expect(yield* both(a, b)).toEqual(["a", 2])
    }),
  )

  it.effect("a failure of the first interrupts the second, which is over before the failure goes on", () =>
    Effect.gen(function* () {
      const interrupted = yield* Deferred.make<void>()
      const started = yield* Deferred.make<void>()
      const b = Effect.zipRight(Deferred.succeed(started, undefined), Effect.never).pipe(
        Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)),
      )
      const a = Effect.zipRight(Deferred.await(started), Effect.fail("a failed" as const))
      const exit = yield* Effect.exit(both(a, b))
      expect(exit).toEqual(Exit.fail("a failed"))
      expect(yield* Deferred.isDone(interrupted)).toBe(true)
    }),
  )

  it.live("a failure of the second is the answer once the first is done", () =>
    Effect.gen(function* () {
      let firstDone = false
      const a = Effect.sleep("20 millis").pipe(Effect.tap(() => (firstDone = true)))
      const exit = yield* Effect.exit(both(a, Effect.fail("b failed" as const)))
      expect(exit).toEqual(Exit.fail("b failed"))
      expect(firstDone).toBe(true)
    }),
  )

  it.effect("interrupting the whole interrupts both, and both are over when it is", () =>
    Effect.gen(function* () {
      const ended: Array<string> = []
      const hang = (name: string, started: Deferred.Deferred<void>) =>
        Effect.zipRight(Deferred.succeed(started, undefined), Effect.never).pipe(
          Effect.onInterrupt(() => Effect.sync(() => ended.push(name))),
        )
      const [aStarted, bStarted] = [yield* Deferred.make<void>(), yield* Deferred.make<void>()]
      const fiber = yield* Effect.fork(both(hang("a", aStarted), hang("b", bStarted)))
      yield* Deferred.await(aStarted)
      yield* Deferred.await(bStarted)
      yield* Fiber.interrupt(fiber)
      expect(ended.sort()).toEqual(["a", "b"])
    }),
  )
})
