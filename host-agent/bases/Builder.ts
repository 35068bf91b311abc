/**
 * The host's bases on first start: every recipe of `BasesSettings.recipes` whose base is not on
 * disk is built in the background, side by side (downloads and package installs overlap: both full
 * bases took about as long together as one alone), while the host agent already runs. Progress is logged as mmdebstrap reports its steps; meanwhile the
 * host record lists the base as building (`Listing.buildingIn`), so functions may name it and their
 * runs wait in the queue (`HostActor` refuses their placement until the base is on disk).
 *
 * A build that fails (no network, say) is logged and tried again after `retryMs`; closing the
 * scope (the agent stops) interrupts it, which stops mmdebstrap and removes its temporary folder.
 */
import { Duration, Effect, Layer, Runtime, Schedule } from "effect"
import { BasesSettings, ensure, find, recipePathOf } from "./Bases.ts"

/** How long after a failed build it is tried again. */
export const retryMs = 120_000

/** How often a build that reports nothing new says it is still going. */
export const stillMs = 30_000

// mmdebstrap's own progress lines ("I: downloading packages with apt...") are the steps logged.
const stepOf = (line: string) => (line.startsWith("I: ") ? line.slice(3).trim() : undefined)

/** The base of one recipe: found on disk, or built now with its progress logged (minutes). */
export const buildOne = (dir: string, recipe: string) =>
  Effect.gen(function* () {
    const path = recipePathOf(recipe)
    const found = yield* find(dir, path)
    if (found !== undefined) return found
    const started = Date.now()
    const seconds = () => Math.round((Date.now() - started) / 1000)
    const runtime = yield* Effect.runtime<never>()
    yield* Effect.logInfo(
      "building a base in the background (first start only, a few minutes); runs on it wait in the queue",
    )
    let last = "starting"
    const build = ensure(dir, path, (line) => {
      const step = stepOf(line)
      if (step === undefined) return
      last = step
      Runtime.runFork(runtime)(
        Effect.logInfo(`base build: ${step}`).pipe(Effect.annotateLogs({ seconds: seconds() })),
      )
    })
    // Installing packages says nothing for minutes: a line every `stillMs` shows the build lives.
    const still = Effect.suspend(() =>
      Effect.logInfo(`base build: still at "${last}"`).pipe(Effect.annotateLogs({ seconds: seconds() })),
    ).pipe(Effect.delay(Duration.millis(stillMs)), Effect.forever)
    const base = yield* Effect.raceFirst(build, still)
    yield* Effect.logInfo("base built").pipe(Effect.annotateLogs({ base: base.name, seconds: seconds() }))
    return base
  }).pipe(Effect.annotateLogs({ recipe }))

/** Builds the host's missing bases in the background for the life of the scope. */
export const layer = Layer.scopedDiscard(
  Effect.gen(function* () {
    const { dir, recipes } = yield* BasesSettings.Tag
    yield* Effect.forEach(
      recipes,
      (recipe) =>
        buildOne(dir, recipe).pipe(
          Effect.tapError((e) =>
            Effect.logError("base build failed; trying again later").pipe(
              Effect.annotateLogs({ recipe, retry_ms: retryMs, detail: e.detail.slice(-1500) }),
            ),
          ),
          Effect.retry(Schedule.spaced(Duration.millis(retryMs))),
        ),
      { concurrency: "unbounded", discard: true },
    ).pipe(Effect.annotateLogs({ role: "host-agent" }), Effect.forkScoped)
  }),
)
