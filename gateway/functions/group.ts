/**
 * The definitions route group — bases, functions, providers, catalog, tools — with the services
 * its handlers use: the function, provider and secret stores, the bases listing, the vendors, and
 * sealing (the keyring's wrapped data keys in KV `secrets`).
 */
import { Layer } from "effect"
import * as Functions from "../../core/Functions.ts"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as Providers from "../../core/Providers.ts"
import * as Seal from "../../core/Seal.ts"
import * as Secrets from "../../core/Secrets.ts"
import * as Vendors from "../../core/vendors/Vendors.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import * as Bases from "../bases/Bases.ts"
import * as Catalog from "../catalog/routes.ts"
import * as ProviderRoutes from "../providers/routes.ts"
import * as Tools from "../tools/Tools.ts"
import * as FunctionRoutes from "./routes.ts"

/** What the group's handlers need (besides the auth step). */
export type Services = Layer.Layer.Success<typeof layer>

/** The group's routes, each with its access label and documentation. */
export const routes = [
  ...Bases.routes,
  ...FunctionRoutes.routes,
  ...ProviderRoutes.routes,
  ...Catalog.routes,
  ...Tools.routes,
]

/** `Seal` over the keyring, with data keys wrapped by the master key and kept in KV. */
export const sealLayer = Seal.layer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(WrappedKeyStore.layerStorage),
)

/** The services of the group's handlers; needs NATS, the storage map, the master key and vendor settings. */
export const layer = Layer.mergeAll(
  Functions.layer,
  Providers.layer,
  Secrets.layer.pipe(Layer.provide(sealLayer)),
  Bases.layer,
  Vendors.layer,
)

/** The services with the master key and vendor settings read from `HANGAR_*` variables. */
export const layerFromEnv = layer.pipe(
  Layer.provide(MasterKey.layer),
  Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
  Layer.provide(Vendors.VendorSettings.layerFromEnv),
)
