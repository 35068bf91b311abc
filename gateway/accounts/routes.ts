/**
 * Every route of the people-and-keys group (me, account, members, invites, keys) and of the
 * account's money and webhook key (usage, webhook public key).
 */
import * as Webhooks from "../webhooks/routes.ts"
import * as Account from "./Account.ts"
import * as Invites from "./Invites.ts"
import * as Keys from "./Keys.ts"
import * as Me from "./Me.ts"
import * as Usage from "./Usage.ts"

/** The group's routes, each carrying its access label. */
export const routes = [
  ...Me.routes,
  ...Account.routes,
  ...Invites.routes,
  ...Keys.routes,
  ...Usage.routes,
  ...Webhooks.routes,
]
