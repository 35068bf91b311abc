/**
 * Two effects side by side, for hot paths. `Effect.all([a, b], { concurrency: 2 })` takes about 150
 * fiber steps and five fiber runs for its bookkeeping (about 0.2 ms here, on the path of every
 * command and run start); `both` forks one of them: about 45 steps and two runs.
 */
import { Effect, Exit, Fiber } from "effect"

/**
 * Runs `a` here and `b` in a child fiber at the same time, answering both results. When either
 * fails or the whole is interrupted, `b` is interrupted (and awaited) before the failure goes on;
 * unlike `Effect.all`, a failure of `b` is seen once `a` is done, so `a` is not cut short by it.
 */
export const both = <A, E1, R1, B, E2, R2>(
  a: Effect.Effect<A, E1, R1>,
  b: Effect.Effect<B, E2, R2>,
): Effect.Effect<readonly [A, B], E1 | E2, R1 | R2> =>
  Effect.flatMap(Effect.fork(b), (other) =>
    Effect.onExit(Effect.zip(a, Fiber.join(other)), (exit) =>
      Exit.isSuccess(exit) ? Effect.void : Fiber.interrupt(other),
    ),
  )
