/**
 * The `hangar` commands for users (spec "Command-line tool"), against the HTTP API only: a laptop
 * that reaches nothing but the API can run all of them. Each command's code is loaded only when it
 * runs, so `hangar version` starts at once.
 *
 * Exit status: 0 worked, 1 run failed, 2 wrong command (usage printed), 3 API refused (its code
 * and message printed), 4 anything else; `exec` and `shell` exit with the remote status (`exec`:
 * 125 when the command could not be run).
 */
import { parseArgs } from "node:util"
import * as Api from "./Api.ts"
import type { Command } from "./Command.ts"
import { ApiRefused, ExitWith, exitStatusOf, UsageError } from "./Failures.ts"
import { note, outOf } from "./Print.ts"

interface Entry {
  readonly usage: string
  readonly summary: string
  readonly load: () => Promise<Command>
}

const from =
  <K extends string>(load: () => Promise<Record<K, Command>>, name: K) =>
  () =>
    load().then((m) => m[name])
const functions = () => import("./commands/functions.ts")
const runs = () => import("./commands/runs.ts")
const providers = () => import("./commands/providers.ts")

/** Every user command, in the order help lists them. */
export const table: Readonly<Record<string, Entry>> = {
  login: {
    usage: "login",
    summary: "sign this machine in: a person approves the code in the console; the key is saved",
    load: () => import("./commands/login.ts").then((m) => m.login),
  },
  bases: { usage: "bases", summary: "list the bases machines start from", load: from(functions, "bases") },
  functions: {
    usage: "functions",
    summary: "list the account's functions",
    load: from(functions, "functions"),
  },
  publish: {
    usage: "publish FILE",
    summary: "publish a function from a JSON or YAML definition (new function, or its next version)",
    load: from(functions, "publish"),
  },
  run: {
    usage:
      "run FUNCTION --prompt TEXT [--in DIR] [--out DIR] [--version N] [--webhook URL] [--ref REF] [--detach]",
    summary: "start a run, follow it to its end, and fetch its output",
    load: from(runs, "run"),
  },
  runs: {
    usage: "runs [--function F] [--state active|succeeded|failed] [--before RUN]",
    summary: "list runs, newest first",
    load: from(runs, "runs"),
  },
  show: { usage: "show RUN", summary: "show one run", load: from(runs, "show") },
  logs: { usage: "logs RUN [--follow]", summary: "print a run's log", load: from(runs, "logs") },
  output: {
    usage: "output RUN --out DIR",
    summary: "download and unpack a run's output",
    load: from(runs, "output"),
  },
  providers: { usage: "providers", summary: "list model providers", load: from(providers, "providers") },
  models: {
    usage: "models VENDOR   (key on stdin)",
    summary: "list a vendor's models for a key",
    load: from(providers, "models"),
  },
  provider: {
    usage: "provider NAME --vendor V --model M [--effort E] [--compact N] [--max-output N]   (key on stdin)",
    summary: "publish a provider (new, or its next version)",
    load: from(providers, "provider"),
  },
  exec: {
    usage: "exec RUN [--workdir DIR] [--timeout SECONDS] -- COMMAND…",
    summary: "run a command in a run's machine, streaming its output; exits with its status",
    load: () => import("./commands/exec.ts").then((m) => m.exec),
  },
  cp: {
    usage: "cp LOCAL RUN:PATH | cp RUN:PATH LOCAL",
    summary: "copy a file or folder into or out of a run",
    load: () => import("./commands/cp.ts").then((m) => m.cp),
  },
  finish: {
    usage: "finish RUN [--failed REASON]",
    summary: "end a run: succeeded (its output is checked), or failed with a reason",
    load: from(runs, "finish"),
  },
  shell: {
    usage: "shell RUN",
    summary: "open an end-to-end encrypted terminal in a run",
    load: () => import("./commands/shell.ts").then((m) => m.shell),
  },
  version: { usage: "version", summary: "print the CLI's version", load: async () => versionCommand },
}

/** The operator commands `bin.cjs` hands to `cli/main.ts` (listed in help). */
const operator = `
operators:
  hangar serve gateway|relay|actors|host-agent|all
  hangar admin create-account|token|credit|suspend|reactivate …`

const usageOf = (name: string) => `usage: hangar ${table[name]?.usage}\n  ${table[name]?.summary}`

/** The whole help. */
export const help = (): string => {
  const width = Math.max(...Object.keys(table).map((k) => k.length))
  return `usage: hangar COMMAND [--json] [--help]

commands:
${Object.entries(table)
  .map(([k, e]) => `  ${k.padEnd(width)}  ${e.summary}`)
  .join("\n")}
${operator}

environment: SERVICE_API (default ${Api.DEFAULT_API}), SERVICE_KEY, NO_COLOR
exit status: 0 worked, 1 run failed, 2 wrong command, 3 API refused, 4 anything else`
}

declare const HANGAR_VERSION: string | undefined

const versionCommand: Command = {
  positionals: [0, 0],
  run: async ({ out }) => {
    const v =
      typeof HANGAR_VERSION === "string"
        ? HANGAR_VERSION
        : ((await import("../../package.json", { with: { type: "json" } })).default as { version: string })
            .version
    if (out.json) process.stdout.write(`${JSON.stringify({ version: v })}\n`)
    else process.stdout.write(`${v}\n`)
  },
}

/** The place (from 1) of the first empty positional before `--`, if any. */
const emptyPositional = (
  tokens: ReadonlyArray<{ readonly kind: string; readonly value?: unknown }>,
): number | undefined => {
  let place = 0
  for (const t of tokens) {
    if (t.kind === "option-terminator") return undefined
    if (t.kind !== "positional") continue
    place++
    if (t.value === "") return place
  }
  return undefined
}

/** Runs `argv` (without `node` and the script); answers the exit status. */
export const main = async (
  argv: ReadonlyArray<string>,
  env: NodeJS.ProcessEnv = process.env,
): Promise<number> => {
  const [name, ...rest] = argv
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    const topic = name === "help" ? rest[0] : undefined
    if (topic !== undefined && table[topic]) process.stdout.write(`${usageOf(topic)}\n`)
    else process.stdout.write(`${help()}\n`)
    return name === undefined ? 2 : 0
  }
  if (name === "--version") return main(["version"], env)
  const entry = table[name]
  if (entry === undefined) {
    note(`hangar: unknown command: ${name}\n${help()}`)
    return 2
  }
  let json = false
  try {
    const command = await entry.load()
    const { values, positionals, tokens } = (() => {
      try {
        return parseArgs({
          args: [...rest],
          options: { json: { type: "boolean" }, help: { type: "boolean", short: "h" }, ...command.options },
          allowPositionals: true,
          strict: true,
          tokens: true,
        })
      } catch (e) {
        throw new UsageError((e as Error).message.replace(/\. To specify a positional.*$/s, ""))
      }
    })()
    json = values.json === true
    if (values.help) {
      process.stdout.write(`${usageOf(name)}\n`)
      return 0
    }
    const [least, most] = command.positionals
    if (positionals.length < least) throw new UsageError(`missing arguments`)
    if (positionals.length > most) throw new UsageError(`unexpected argument: ${positionals[most]}`)
    // An empty name or id (`hangar exec "$RUN" -- …` with RUN unset) is refused here rather than
    // sent as an empty path segment, which the API can only answer "route not found". Words after
    // `--` are the remote command's own, where an empty word can mean something.
    const empty = emptyPositional(tokens)
    if (empty !== undefined) throw new UsageError(`argument ${empty} is empty (an unset variable?)`)
    await command.run({ api: Api.make(env), out: outOf(json, env), values, positionals, env })
    return 0
  } catch (e) {
    const status = exitStatusOf(e)
    if (e instanceof UsageError) note(`hangar ${name}: ${e.message}\n${usageOf(name)}`)
    else if (e instanceof ApiRefused) {
      if (json) process.stdout.write(`${JSON.stringify({ error: e.detail, code: e.code })}\n`)
      note(`hangar ${name}: ${e.code}: ${e.detail}`)
    } else if (!(e instanceof ExitWith)) note(`hangar ${name}: ${e instanceof Error ? e.message : String(e)}`)
    return status
  }
}
