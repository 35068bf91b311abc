/**
 * The uploads route group (`POST /v1/files`, the signed `PUT /v1/uploads/<id>`) and the services
 * it stands on: the link signer, the upload records, the `files` object store and streaming
 * encryption (keyring over the master key and the wrapped keys in KV `secrets`).
 */
import { Layer } from "effect"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as SealStream from "../../core/SealStream.ts"
import * as Uploads from "../../core/Uploads.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import { createRoute } from "./Create.ts"
import * as Links from "./Links.ts"
import { filesLayer, putRoute } from "./Put.ts"

/** The group's routes. */
export const routes = [createRoute, putRoute]

/**
 * What the routes need beyond the auth step, given NATS, the storage map, `UploadSettings`,
 * `LinkSettings` (the link key) and `MasterKeySettings`.
 */
export const layerServices = Layer.mergeAll(
  Links.layer,
  Uploads.layer,
  filesLayer,
  SealStream.layer.pipe(
    Layer.provide(Keyring.layer),
    Layer.provide(Layer.merge(MasterKey.layer, WrappedKeyStore.layerStorage)),
  ),
)

/**
 * The services with their settings read from `HANGAR_*` variables (the upload settings are kept:
 * the routes read them). `LinkSettings` is left to the caller, which shares it with download links.
 */
export const layer = layerServices.pipe(
  Layer.provideMerge(Links.UploadSettings.layerFromEnv),
  Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
)
