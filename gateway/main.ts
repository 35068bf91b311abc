/**
 * The gateway role: composes the server with every route group and its settings. `layer` is what
 * the one-process mode (`hangar serve all`) merges with the other roles; `hangar serve gateway`
 * runs it alone (cli/main.ts).
 */
import { Layer } from "effect"
import type { Accounts as AccountStore } from "../core/Accounts.ts"
import type { ConsoleSessions } from "../core/ConsoleSessions.ts"
import { ConsoleSettings } from "../core/ConsoleSessions.ts"
import * as Links from "../core/Links.ts"
import { IssuerSettings } from "../core/LocalIssuer.ts"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"
import { TerminalSettings } from "../core/TerminalSettings.ts"
import * as Accounts from "./accounts/routes.ts"
import type { AccountStates } from "./accounts/States.ts"
import * as Auth from "./auth/Auth.ts"
import type { IdTokens } from "./auth/IdTokens.ts"
import type { KeyCache } from "./auth/KeyCache.ts"
import * as Commands from "./commands/routes.ts"
import * as ConsoleAssets from "./console/Assets.ts"
import * as Console from "./console/routes.ts"
import * as Credit from "./credit/group.ts"
import * as Downloads from "./downloads/routes.ts"
import * as Definitions from "./functions/group.ts"
import * as Health from "./Health.ts"
import * as CliLogins from "./logins/CliLogins.ts"
import * as Logins from "./logins/routes.ts"
import * as OpenApi from "./openapi/OpenApi.ts"
import * as RateLimit from "./RateLimit.ts"
import * as Runs from "./runs/routes.ts"
import * as Server from "./Server.ts"
import * as Uploads from "./uploads/routes.ts"

const served = [
  ...Health.routes,
  ...Accounts.routes,
  ...Definitions.routes,
  ...Logins.routes,
  ...Credit.routes,
  ...Uploads.routes,
  ...Downloads.routes,
  ...Runs.routes,
  ...Commands.routes,
]
/**
 * Every route the gateway serves; each route group contributes its `routes`, and the document of
 * them all; then the web console's pages and sign-in routes (not part of the API's document).
 */
export const routes = [...served, ...OpenApi.routesFor(served), ...Console.routes]

// Signed links (upload and download links share the key), settings from `HANGAR_*` variables.
const linkServices = Links.layer.pipe(Layer.provideMerge(Links.LinkSettings.layerFromEnv))

// The downloads, runs and commands groups' services (they also use the definitions and uploads groups' stores).
const runServices = Layer.mergeAll(Downloads.layer, Runs.layerFromEnv, Commands.layerFromEnv)

// The CLI login, credit and uploads groups' services, settings from `HANGAR_*` variables.
const groupServices = Layer.mergeAll(
  CliLogins.layerFromEnv,
  Credit.layerFromEnv,
  Uploads.layer,
  ConsoleAssets.layer,
  ConsoleSettings.layerFromEnv,
  TerminalSettings.layerFromEnv,
  // The console's OIDC sign-in reads the issuer settings too.
  IssuerSettings.layerFromEnv,
)

/**
 * The gateway with its settings read from `HANGAR_*` variables (logging is the process's choice);
 * like every role it needs the process's NATS connection and storage.
 */
export const layer = Server.layer<
  | Auth.Auth
  | KeyCache
  | AccountStates
  | AccountStore
  | Definitions.Services
  | Layer.Layer.Success<typeof groupServices>
  | Layer.Layer.Success<typeof runServices>
  | Layer.Layer.Success<typeof linkServices>
  | ConsoleSessions
  | IdTokens
  // Routes reading streams and actor state straight from the process's connection (usage, balance).
  | Nats
  | Storage
>(routes).pipe(
  Layer.provide(RateLimit.layer),
  Layer.provide(RateLimit.RateLimitSettings.layerFromEnv),
  Layer.provide(Server.HttpSettings.layerFromEnv),
  // Before the auth layers: the login service reads the account store they provide.
  Layer.provide(groupServices),
  Layer.provide(runServices),
  Layer.provide(linkServices),
  Layer.provide(Auth.layerAll),
  Layer.provide(Definitions.layerFromEnv),
  Layer.provide(IssuerSettings.layerFromEnv),
)
