/** The shape of one CLI command: its usage, its options (`node:util` `parseArgs`) and what it does. */
import type { ParseArgsConfig } from "node:util"
import type { Api } from "./Api.ts"
import type { Out } from "./Print.ts"

/** What a command is given. */
export interface Context {
  readonly api: Api
  readonly out: Out
  /** The options as parsed (strings and booleans). */
  readonly values: Readonly<Record<string, string | boolean | undefined>>
  /** The positional arguments, after the command's name (everything after `--` too). */
  readonly positionals: ReadonlyArray<string>
  readonly env: NodeJS.ProcessEnv
}

/** What a command does; its usage and summary are in `main.ts`'s table, so help loads no command. */
export interface Command {
  /** Its options besides `--json` and `--help`. */
  readonly options?: NonNullable<ParseArgsConfig["options"]>
  /** How many positionals it takes: [least, most] (most: Infinity after `--`). */
  readonly positionals: readonly [number, number]
  readonly run: (context: Context) => Promise<void>
}

/** The option as a string, or undefined. */
export const text = (values: Context["values"], name: string): string | undefined => {
  const v = values[name]
  return typeof v === "string" ? v : undefined
}
