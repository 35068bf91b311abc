/**
 * Operator commands (`hangar admin …`). Each prints one JSON object on stdout; logs and errors go
 * to stderr. They talk to the running stack's NATS (`HANGAR_NATS_URL`, default the local
 * `nats://127.0.0.1:4222`) and storage (`HANGAR_STORAGE_PREFIX`), and mint tokens with the local
 * issuer's key in the data folder (`HANGAR_OIDC_KEY_FILE`, default `.data/issuer.key`).
 *
 *   hangar admin create-account --name NAME --owner EMAIL [--credit-usd N]
 *                                                   → {account, owner[, credit: {entry, balance_usd_nanos}]}
 *     (N > 0 in dollars: the new account's first `adjustment` ledger entry)
 *   hangar admin token --email EMAIL                        → {token}
 *   hangar admin console-link --email EMAIL                 → {url}: a one-time web console sign-in
 *     link for that person (local mode), valid 10 minutes (`HANGAR_CONSOLE_LINK_MS`), usable once
 *   hangar admin suspend --account ID                       → {account}
 *   hangar admin reactivate --account ID                    → {account}
 *   hangar admin credit --account ID --usd N                → {account, entry, balance_usd_nanos}
 *     (N in dollars, may be negative, up to 9 decimals: an `adjustment` ledger entry)
 *   hangar admin hosts                                      → {hosts: [{id, live, heartbeat_age_ms, draining,
 *                                                              vcpus, used_vcpus, free_vcpus, …, machines, runs}]}
 *   hangar admin drain --host ID                            → {host, draining: true, runs}
 *     (the host takes no new runs; its running ones go on: stop it once `runs` is empty)
 *   hangar admin undrain --host ID                          → {host, draining: false, runs}
 *   hangar admin watch [--account ID] [--run ID] [--count N] → one operator event a line (JSON; a
 *     compact line on a terminal), live, until interrupted or N events (then nothing more)
 *   hangar admin watch --hosts [--count N]                  → each host's record, then its changes,
 *     one line each (`{type: "host", host, live, free_vcpus, …}` or `{type: "host.removed", host}`)
 *
 * Exit status: 0 worked, 2 wrong command or arguments, 4 anything else.
 */
import { Cause, Effect, Exit, Layer, Option, Schema } from "effect"
import { entryOf } from "../actors/account/Account.ts"
import { Accounts, layer as accountsLayer } from "../core/Accounts.ts"
import * as AccountClient from "../core/actors/AccountClient.ts"
import * as Connected from "../core/Connected.ts"
import * as ConsoleSessions from "../core/ConsoleSessions.ts"
import { IssuerSettings, loadKey, mint } from "../core/LocalIssuer.ts"
import * as Log from "../core/Log.ts"
import type { AccountState } from "../schema/Account.ts"
import { Email } from "../schema/Account.ts"
import { HostId } from "../schema/Host.ts"
import { AccountId, RunId } from "../schema/Ids.ts"
import * as AdminHosts from "./adminHosts.ts"
import * as AdminWatch from "./adminWatch.ts"

/** Usage of the admin commands. */
export const usage = `usage:
  hangar admin create-account --name NAME --owner EMAIL [--credit-usd N]
  hangar admin token --email EMAIL
  hangar admin console-link --email EMAIL
  hangar admin suspend --account ID
  hangar admin reactivate --account ID
  hangar admin credit --account ID --usd N
  hangar admin hosts
  hangar admin drain --host ID
  hangar admin undrain --host ID
  hangar admin watch [--account ID] [--run ID] [--count N]
  hangar admin watch --hosts [--count N]`

class UsageError extends Error {}

const flags = (
  args: ReadonlyArray<string>,
  required: ReadonlyArray<string>,
  optional: ReadonlyArray<string> = [],
): Record<string, string> => {
  const out: Record<string, string> = {}
  for (let i = 0; i < args.length; i += 2) {
    const name = args[i]!
    const value = args[i + 1]
    if (!name.startsWith("--") || ![...required, ...optional].includes(name.slice(2)))
      throw new UsageError(`unknown argument: ${name}`)
    if (value === undefined) throw new UsageError(`${name} needs a value`)
    if (out[name.slice(2)] !== undefined) throw new UsageError(`${name} is given twice`)
    out[name.slice(2)] = value
  }
  for (const a of required) if (out[a] === undefined) throw new UsageError(`--${a} is required`)
  return out
}

const email = (value: string): string => {
  if (!Schema.is(Email)(value)) throw new UsageError(`not an e-mail address: ${value}`)
  return value.toLowerCase()
}

const accountId = (value: string): string => {
  if (!Schema.is(AccountId)(value)) throw new UsageError(`not an account id: ${value}`)
  return value
}

const hostId = (value: string): string => {
  if (!Schema.is(HostId)(value)) throw new UsageError(`not a host id: ${value}`)
  return value
}

// NATS, the ensured storage map and the account store, all from HANGAR_* variables.
const storeLayer = accountsLayer.pipe(Layer.provideMerge(Connected.layerFromEnv))

const withStore = <A, E>(f: (accounts: Context) => Effect.Effect<A, E>) =>
  Effect.flatMap(Accounts, f).pipe(Effect.provide(storeLayer))
type Context = Effect.Effect.Success<typeof Accounts>

/** Dollars as written (`12`, `-0.5`, `3.000000001`) → integer nanodollars, exactly; `flag` names the argument in refusals. */
export const usdToNanos = (value: string, flag = "--usd"): number => {
  const m = /^(-?)(\d+)(?:\.(\d{1,9}))?$/.exec(value.trim())
  if (m === null) throw new UsageError(`${flag} must be a dollar amount with at most 9 decimals: ${value}`)
  const nanos = BigInt(m[2]!) * 1_000_000_000n + BigInt((m[3] ?? "").padEnd(9, "0"))
  const signed = m[1] === "-" ? -nanos : nanos
  if (signed === 0n) throw new UsageError(`${flag} must not be zero`)
  if (signed > BigInt(Number.MAX_SAFE_INTEGER) || -signed > BigInt(Number.MAX_SAFE_INTEGER))
    throw new UsageError(`${flag} is too large: ${value}`)
  return Number(signed)
}

// Credits through the account actor (the only writer of balances), once the account is known.
const credit = (id: string, nanos: number) =>
  Effect.gen(function* () {
    const account = yield* Effect.flatMap(Accounts, (accounts) => accounts.account(id))
    if (Option.isNone(account)) return yield* Effect.fail(new Error(`account not found: ${id}`))
    const { message, balance_usd_nanos } = yield* AccountClient.adjust(id, "adjustment", nanos)
    return { account: id, entry: entryOf(id, message), balance_usd_nanos }
  }).pipe(
    Effect.provide(
      Layer.merge(accountsLayer, AccountClient.mailboxLayer).pipe(Layer.provideMerge(Connected.layerFromEnv)),
    ),
  )

const setState = (id: string, state: AccountState) =>
  withStore((accounts) =>
    Effect.map(accounts.setState(id, state), (a) => ({
      account: { id: a.id, name: a.name, state: a.state },
    })),
  )

const token = (address: string) =>
  Effect.gen(function* () {
    const settings = yield* IssuerSettings.Tag
    if (settings.issuer !== "") {
      return yield* Effect.fail(
        new Error(
          `people sign in with ${settings.issuer}; the local issuer is off (HANGAR_OIDC_ISSUER is set)`,
        ),
      )
    }
    const key = yield* loadKey(settings.keyFile)
    return {
      token: yield* mint(key, {
        email: address,
        audience: settings.audience,
        ttlSeconds: settings.ttlSeconds,
      }),
    }
  }).pipe(Effect.provide(IssuerSettings.layerFromEnv))

// A link into the console's sign-in route; only its hash is stored (core/ConsoleSessions.ts).
const consoleLink = (address: string) =>
  Effect.gen(function* () {
    const issuer = yield* IssuerSettings.Tag
    if (issuer.issuer !== "")
      return yield* Effect.fail(
        new Error(
          `people sign in with ${issuer.issuer}; console links are for local mode (HANGAR_OIDC_ISSUER is set)`,
        ),
      )
    const settings = yield* ConsoleSessions.ConsoleSettings.Tag
    const sessions = yield* ConsoleSessions.ConsoleSessions
    const link = yield* sessions.createLink(address, settings.linkMs)
    return { url: `${settings.consoleUrl.replace(/\/+$/, "")}/console/sign-in?link=${link}` }
  }).pipe(
    Effect.provide(
      Layer.mergeAll(
        ConsoleSessions.layer.pipe(Layer.provide(Connected.layerFromEnv)),
        ConsoleSessions.ConsoleSettings.layerFromEnv,
        IssuerSettings.layerFromEnv,
      ),
    ),
  )

/** The program of one admin command (arguments after `admin`); throws `UsageError` on bad usage. */
const program = (args: ReadonlyArray<string>): Effect.Effect<unknown, unknown> => {
  const [command, ...rest] = args
  switch (command) {
    case "create-account": {
      const f = flags(rest, ["name", "owner"], ["credit-usd"])
      const name = f.name!.trim()
      if (name === "") throw new UsageError("--name must not be empty")
      const owner = email(f.owner!)
      // Checked before anything is made, so a bad amount creates no account.
      const creditNanos =
        f["credit-usd"] === undefined ? undefined : usdToNanos(f["credit-usd"], "--credit-usd")
      if (creditNanos !== undefined && creditNanos < 0)
        throw new UsageError("--credit-usd must be more than zero")
      return Effect.gen(function* () {
        const made = yield* withStore((accounts) => accounts.createAccount(name, owner))
        const created = {
          account: { id: made.account.id, name: made.account.name, state: made.account.state },
          owner: made.owner,
        }
        if (creditNanos === undefined) return created
        const credited = yield* credit(made.account.id, creditNanos).pipe(
          Effect.mapError(
            (e) =>
              new Error(
                `account ${made.account.id} was created, but its credit was not: ${e instanceof Error ? e.message : String(e)}; run \`hangar admin credit --account ${made.account.id} --usd ${f["credit-usd"]}\``,
              ),
          ),
        )
        return {
          ...created,
          credit: { entry: credited.entry, balance_usd_nanos: credited.balance_usd_nanos },
        }
      })
    }
    case "token":
      return token(email(flags(rest, ["email"]).email!))
    case "console-link":
      return consoleLink(email(flags(rest, ["email"]).email!))
    case "suspend":
      return setState(accountId(flags(rest, ["account"]).account!), "suspended")
    case "reactivate":
      return setState(accountId(flags(rest, ["account"]).account!), "active")
    case "credit": {
      const f = flags(rest, ["account", "usd"])
      return credit(accountId(f.account!), usdToNanos(f.usd!))
    }
    case "hosts":
      flags(rest, [])
      return AdminHosts.hosts
    case "drain":
      return AdminHosts.drain(hostId(flags(rest, ["host"]).host!))
    case "undrain":
      return AdminHosts.undrain(hostId(flags(rest, ["host"]).host!))
    case "watch": {
      // `--hosts` is the one flag without a value.
      const hosts = rest.includes("--hosts")
      const f = flags(
        rest.filter((a) => a !== "--hosts"),
        [],
        hosts ? ["count"] : ["account", "run", "count"],
      )
      if (f.run !== undefined && !Schema.is(RunId)(f.run)) throw new UsageError(`not a run id: ${f.run}`)
      const count = f.count === undefined ? undefined : Number(f.count)
      if (count !== undefined && !(Number.isInteger(count) && count >= 1 && count <= 1_000_000))
        throw new UsageError(`--count must be a whole number from 1 to 1000000: ${f.count}`)
      const print = (line: string) => process.stdout.write(`${line}\n`)
      const watched = hosts
        ? AdminWatch.watchHosts(count, print)
        : AdminWatch.watch(
            { account: f.account === undefined ? undefined : accountId(f.account), run: f.run, count },
            print,
          )
      // The events are the output: nothing is printed after them.
      return Effect.as(watched, noResult)
    }
    default:
      throw new UsageError(
        command === undefined ? "no admin command given" : `unknown admin command: ${command}`,
      )
  }
}

/** A command whose output is already written: `main` prints no result after it. */
const noResult = Symbol("no result")

const describe = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure)) {
    const e = failure.value as { message?: unknown; _tag?: unknown }
    if (typeof e?.message === "string" && e.message !== "") return e.message
  }
  return Cause.pretty(cause)
}

/** Runs `hangar admin <args>`: prints the result as JSON and exits 0, or explains and exits 2/4. */
export const main = (args: ReadonlyArray<string>): void => {
  let fx: Effect.Effect<unknown, unknown>
  try {
    fx = program(args)
  } catch (e) {
    if (!(e instanceof UsageError)) throw e
    process.stderr.write(`hangar admin: ${e.message}\n${usage}\n`)
    process.exit(2)
  }
  Effect.runPromiseExit(fx.pipe(Effect.provide(Log.layer))).then((exit) => {
    if (Exit.isSuccess(exit)) {
      if (exit.value !== noResult) process.stdout.write(`${JSON.stringify(exit.value)}\n`)
      process.exit(0)
    }
    process.stderr.write(`hangar admin: ${describe(exit.cause)}\n`)
    process.exit(4)
  })
}
