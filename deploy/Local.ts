/**
 * The one-process mode of `npm start` (`hangar serve all`): the local nats-server (which holds the
 * data folder's lock), the storage map, and every role on one connection. Closing the scope stops
 * the roles first, then drains the connection, then stops nats-server and releases the lock.
 *
 * On a data folder with no account yet it creates a first account, owned by `HANGAR_LOCAL_OWNER`
 * (default `owner@hangar.local`) with `HANGAR_LOCAL_CREDIT_USD` (10) of credit, and prints how to
 * sign that person in to the console and get their token and an admin key.
 */
import { Console, Effect, Layer } from "effect"
import * as Actors from "../actors/main.ts"
import * as Accounts from "../core/Accounts.ts"
import * as AccountClient from "../core/actors/AccountClient.ts"
import { env } from "../core/Config.ts"
import * as Connected from "../core/Connected.ts"
import * as Gateway from "../gateway/main.ts"
import { Server } from "../gateway/Server.ts"
import * as HostAgent from "../host-agent/main.ts"
import * as Relay from "../relay/main.ts"
import * as LocalNats from "./LocalNats.ts"

/** Every role of the service, on the connection and storage they are given. */
export const roles = Layer.mergeAll(Gateway.layer, Relay.layer, Actors.layer, HostAgent.layer)

const howTo = (api: string, account: string, owner: string, creditUsd: number) =>
  [
    `hangar: first account ${account}, owned by ${owner}`,
    `  with $${creditUsd} of credit to start with (more: npx hangar admin credit --account ${account} --usd N)`,
    "  the web console: open the link this prints (once, within 10 minutes):",
    `    npx hangar admin console-link --email ${owner}`,
    "  a token for that person (valid 12 hours):",
    `    TOKEN=$(npx hangar admin token --email ${owner} | jq -r .token)`,
    "  an admin key (shown once):",
    `    curl -s -X POST ${api}/v1/keys -H "authorization: Bearer $TOKEN" -H "service-account: ${account}" \\`,
    `      -H "content-type: application/json" -d '{"name":"local","scope":"admin"}'`,
  ].join("\n")

/** Creates the first account when there is none, and says how to sign in as its owner. */
const firstAccount = Layer.effectDiscard(
  Effect.gen(function* () {
    const owner = yield* env.string("LOCAL_OWNER", "owner@hangar.local")
    const creditUsd = yield* env.integer("LOCAL_CREDIT_USD", 10)
    const store = yield* Accounts.make
    if ((yield* store.views.accounts.keys()).length > 0) return
    const { account } = yield* store.createAccount("local", owner)
    // Runs need credit: a local install can start one at once (a visible adjustment in its ledger).
    if (creditUsd > 0) yield* AccountClient.adjust(account.id, "adjustment", creditUsd * 1_000_000_000)
    yield* Effect.logInfo("first account created").pipe(
      Effect.annotateLogs({ account: account.id, owner, credit_usd: creditUsd }),
    )
    yield* Console.log(howTo((yield* Server).url, account.id, owner, creditUsd))
  }).pipe(Effect.provide(AccountClient.mailboxLayer), Effect.orDie),
)

/** The whole service on a local nats-server, settings from `HANGAR_*`. */
export const layer = Layer.unwrapScoped(
  Effect.gen(function* () {
    const server = yield* LocalNats.LocalNats
    return firstAccount.pipe(Layer.provideMerge(roles), Layer.provide(Connected.layerUrl(server.url)))
  }),
).pipe(
  Layer.tap(() => Effect.logInfo("hangar is up (Ctrl-C stops it)")),
  Layer.provide(LocalNats.layer),
  Layer.provide(LocalNats.LocalNatsSettings.layerFromEnv),
)
