/**
 * Test helpers: a gateway serving the uploads routes on a free port over a real nats-server (the
 * storage under a given prefix, keys in a given folder), an account with an admin key made through
 * the account store, and the stored object read back and opened.
 */
import { join } from "node:path"
import { Chunk, Context, Effect, Exit, Layer, Option, Redacted, Scope, Stream } from "effect"
import { Accounts, type AccountsService } from "../../core/Accounts.ts"
import { makeId } from "../../core/Ids.ts"
import { hashToken, newToken } from "../../core/KeyTokens.ts"
import { LinkSettings } from "../../core/Links.ts"
import { IssuerSettings } from "../../core/LocalIssuer.ts"
import * as Log from "../../core/Log.ts"
import { MasterKeySettings } from "../../core/MasterKey.ts"
import * as Nats from "../../core/Nats.ts"
import type { ObjectInfo } from "../../core/ObjectStore.ts"
import { SealStream } from "../../core/SealStream.ts"
import * as Storage from "../../core/Storage.ts"
import { Uploads, type UploadsService } from "../../core/Uploads.ts"
import type { Key } from "../../schema/Account.ts"
import { timestamp } from "../../schema/Common.ts"
import type { KeyId } from "../../schema/Ids.ts"
import * as Auth from "../auth/Auth.ts"
import * as RateLimit from "../RateLimit.ts"
import type { Route } from "../Router.ts"
import * as Server from "../Server.ts"
import { UploadSettings } from "./Links.ts"
import { FilesStore } from "./Put.ts"
import { layerServices, routes } from "./routes.ts"

/** A running test gateway with handles on its stores. */
export interface UploadGateway {
  readonly url: string
  readonly accounts: AccountsService
  readonly uploads: UploadsService
  readonly lines: Array<string>
  /** The stored object's info and its opened plaintext, or none when absent. */
  readonly stored: (
    account: string,
    id: string,
  ) => Promise<Option.Option<{ readonly info: ObjectInfo; readonly plain: Buffer }>>
  /** Messages in the `files` object store's stream (chunks and metadata of every object). */
  readonly storedMessages: () => Promise<number>
  readonly close: () => Promise<void>
}

/** Options: where NATS is, the storage prefix, the folder for key files, and upload settings. */
export interface GatewayOptions {
  readonly natsUrl: string
  readonly prefix: string
  readonly dir: string
  readonly upload?: Partial<typeof UploadSettings.defaults>
  /** Link settings (the link key; the key file defaults to one in `dir`). */
  readonly links?: Partial<typeof LinkSettings.defaults>
  /** Log lines go here instead of stdout. */
  readonly lines?: Array<string>
}

/** The gateway layer for the uploads routes with everything they need. */
export const gatewayLayer = (options: GatewayOptions) => {
  const base = Layer.mergeAll(Auth.layerAll, layerServices).pipe(
    Layer.provide(IssuerSettings.layer({ keyFile: join(options.dir, "issuer.key") })),
    Layer.provide(MasterKeySettings.layer({ file: join(options.dir, "master.key"), key: Redacted.make("") })),
    Layer.provideMerge(UploadSettings.layer({ ...options.upload })),
    Layer.provideMerge(
      LinkSettings.layer({ keyFile: join(options.dir, "upload-link.key"), ...options.links }),
    ),
    Layer.provideMerge(Storage.layerPrefix(options.prefix)),
    Layer.provideMerge(Nats.layerUrl(options.natsUrl, "hangar-test-uploads")),
  )
  // The routes' requirements are all in `base`, merged below.
  return Server.layer(routes as unknown as ReadonlyArray<Route<never>>).pipe(
    Layer.provide(RateLimit.layer),
    Layer.provide(RateLimit.RateLimitSettings.layer({ perSecond: 1_000_000, burst: 1_000_000 })),
    Layer.provideMerge(Server.HttpSettings.layer({ addr: "127.0.0.1:0" })),
    Layer.provideMerge(base),
  )
}

/** Starts the gateway; `close` stops it and its NATS connection. */
export const startUploadGateway = async (options: GatewayOptions): Promise<UploadGateway> => {
  const lines = options.lines ?? []
  const scope = Effect.runSync(Scope.make())
  const exit = await Effect.runPromiseExit(
    Layer.buildWithScope(gatewayLayer(options), scope).pipe(Effect.provide(Log.layerCollect(lines))),
  )
  if (Exit.isFailure(exit)) {
    await Effect.runPromise(Scope.close(scope, exit))
    throw new Error(`gateway did not start: ${String(exit.cause)}`)
  }
  const context = exit.value
  const files = Context.get(context, FilesStore)
  const seal = Context.get(context, SealStream)
  const nats = Context.get(context, Nats.Nats)
  const stored: UploadGateway["stored"] = (account, id) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const got = yield* files.get(id)
        if (Option.isNone(got)) return Option.none()
        const chunks = yield* Stream.runCollect(got.value.data.pipe(seal.open(account, id)))
        return Option.some({ info: got.value.info, plain: Buffer.concat(Chunk.toReadonlyArray(chunks)) })
      }).pipe(Effect.orDie),
    )
  return {
    url: Context.get(context, Server.Server).url,
    accounts: Context.get(context, Accounts),
    uploads: Context.get(context, Uploads),
    lines,
    stored,
    storedMessages: async () => {
      const info = await nats.jsm.streams.info(`OBJ_${files.bucket}`)
      return info.state.messages
    },
    close: () => Effect.runPromise(Scope.close(scope, Exit.void)),
  }
}

/** Makes an account and an admin key through the account store; returns the account id and token. */
export const accountWithKey = async (
  accounts: AccountsService,
  name: string,
): Promise<{ readonly account: string; readonly token: string }> =>
  Effect.runPromise(
    Effect.gen(function* () {
      const { account, owner } = yield* accounts.createAccount(name, `${name}@example.com`)
      const token = newToken()
      const key: Key = {
        id: makeId("key") as KeyId,
        account: account.id,
        name: "uploads-test",
        scope: "admin",
        functions: ["*"],
        created_at: timestamp(Date.now()),
        created_by: owner.user,
      }
      yield* accounts.createKey(key, hashToken(token))
      return { account: account.id as string, token }
    }).pipe(Effect.orDie),
  )
