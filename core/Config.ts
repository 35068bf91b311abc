/**
 * Settings: one documented Tag per service. Each service file declares its settings with
 * `defineSettings`, which gives it
 *
 * - `Tag`          the Context tag services depend on,
 * - `defaults`     the documented defaults,
 * - `layer(p)`     a layer from defaults overridden by `p` (tests and embedded mode),
 * - `layerFromEnv` a layer reading `HANGAR_*` variables through effect's `Config`
 *                  (the only place that reads the environment), falling back to the defaults.
 *
 * Secrets are `Redacted` values, so printing or logging a settings object never shows them.
 */
import { Config, Context, Effect, Layer, Redacted } from "effect"

export interface Settings<Id extends string, S extends object> {
  readonly Tag: Context.Tag<Id, S>
  readonly defaults: S
  readonly layer: (partial?: Partial<S>) => Layer.Layer<Id>
  readonly layerFromEnv: Layer.Layer<Id>
}

/**
 * Declares the settings of one service. `fromEnv` maps each field to a `Config` that reads its
 * variable; fields it leaves out keep their default. A malformed variable fails the layer with a
 * `ConfigError` naming the variable (so a process refuses to start rather than run misconfigured).
 */
export const defineSettings = <const Id extends string, S extends object>(
  id: Id,
  defaults: S,
  fromEnv: (defaults: S) => { readonly [K in keyof S]?: Config.Config<S[K]> },
): Settings<Id, S> => {
  const Tag = Context.GenericTag<Id, S>(id)
  const layer = (partial: Partial<S> = {}) => Layer.succeed(Tag, { ...defaults, ...partial })
  const layerFromEnv = Layer.effect(
    Tag,
    Effect.gen(function* () {
      const read = fromEnv(defaults) as Record<string, Config.Config<unknown>>
      const values = yield* Config.all(read)
      return { ...defaults, ...(values as Partial<S>) }
    }),
  ).pipe(Layer.orDie)
  return { Tag, defaults, layer, layerFromEnv }
}

/** `HANGAR_<NAME>` with a default, for the common case of a setting read from one variable. */
export const env = {
  string: (name: string, fallback: string) =>
    Config.string(`HANGAR_${name}`).pipe(Config.withDefault(fallback)),
  /**
   * A count, size or duration: a whole number, `min` (0) or more; a smaller one is refused, naming
   * the variable.
   */
  integer: (name: string, fallback: number, min = 0) =>
    Config.integer(`HANGAR_${name}`).pipe(
      Config.validate({ message: `must be a whole number, ${min} or more`, validation: (n) => n >= min }),
      Config.withDefault(fallback),
    ),
  boolean: (name: string, fallback: boolean) =>
    Config.boolean(`HANGAR_${name}`).pipe(Config.withDefault(fallback)),
  redacted: (name: string, fallback: string) =>
    Config.redacted(`HANGAR_${name}`).pipe(Config.withDefault(Redacted.make(fallback))),
} as const
