/** Every route of the people-and-keys group (me, account, members, invites, keys). */
import * as Account from "./Account.ts"
import * as Invites from "./Invites.ts"
import * as Keys from "./Keys.ts"
import * as Me from "./Me.ts"

/** The group's routes, each carrying its access label. */
export const routes = [...Me.routes, ...Account.routes, ...Invites.routes, ...Keys.routes]
