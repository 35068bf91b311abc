/**
 * Person sign-in settings and the local issuer. People present OIDC ID tokens (JWTs). With
 * `HANGAR_OIDC_ISSUER` set, tokens come from that issuer and are checked against its JWKS
 * (`HANGAR_OIDC_JWKS_URL`, else the issuer's discovery document). With it empty (local mode), the
 * service is its own issuer: an Ed25519 key pair in `dataDir/issuer.key` (`HANGAR_OIDC_KEY_FILE`)
 * signs tokens that `hangar admin token --email …` prints.
 *
 * The key file is created on first use, mode 0600, atomically (written and fsynced under a
 * temporary name, then hard-linked to the final name, which fails if it exists), so processes
 * starting together all read the one file that won — through `core/SecretFile.ts`, as the master key is.
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject } from "node:crypto"
import { join } from "node:path"
import { Data, Effect } from "effect"
import { SignJWT } from "jose"
import { defineSettings, env } from "./Config.ts"
import { dataDir } from "./DataDir.ts"
import { readOrCreate } from "./SecretFile.ts"

/** The issuer name of local-mode tokens. */
export const localIssuerName = "hangar-local"

/**
 * `issuer` (`HANGAR_OIDC_ISSUER`, empty = local issuer), `audience` (`HANGAR_OIDC_AUDIENCE`, the
 * client id tokens must be issued for), `jwksUrl` (`HANGAR_OIDC_JWKS_URL`, optional), `keyFile`
 * (`HANGAR_OIDC_KEY_FILE`, the local issuer's key), `ttlSeconds` (`HANGAR_OIDC_LOCAL_TTL`, the
 * lifetime of locally minted tokens).
 */
export const IssuerSettings = defineSettings(
  "hangar/IssuerSettings",
  {
    issuer: "",
    audience: "hangar",
    jwksUrl: "",
    keyFile: join(dataDir, "issuer.key"),
    ttlSeconds: 12 * 60 * 60,
  },
  (d) => ({
    issuer: env.string("OIDC_ISSUER", d.issuer),
    audience: env.string("OIDC_AUDIENCE", d.audience),
    jwksUrl: env.string("OIDC_JWKS_URL", d.jwksUrl),
    keyFile: env.string("OIDC_KEY_FILE", d.keyFile),
    ttlSeconds: env.integer("OIDC_LOCAL_TTL", d.ttlSeconds),
  }),
)

/** The local issuer's key could not be read, created or parsed. */
export class IssuerKeyError extends Data.TaggedError("IssuerKeyError")<{
  readonly file: string
  readonly reason: string
  readonly cause?: unknown
}> {
  override get message() {
    return `local issuer key ${this.file}: ${this.reason}`
  }
}

/** The local issuer's key pair; `kid` names it in token headers. */
export interface LocalIssuerKey {
  readonly privateKey: KeyObject
  readonly publicKey: KeyObject
  readonly kid: string
}

/** Loads the local issuer's key pair, creating the file (0600, atomically) when absent. */
export const loadKey = (file: string): Effect.Effect<LocalIssuerKey, IssuerKeyError> =>
  Effect.tryPromise({
    try: () =>
      readOrCreate(file, () =>
        Buffer.from(
          generateKeyPairSync("ed25519").privateKey.export({ format: "pem", type: "pkcs8" }) as string,
        ),
      ).then((bytes) => bytes.toString("utf8")),
    catch: (cause) => new IssuerKeyError({ file, reason: "cannot read or create", cause }),
  }).pipe(
    Effect.flatMap((pem) =>
      Effect.try({
        try: () => {
          const privateKey = createPrivateKey(pem)
          if (privateKey.asymmetricKeyType !== "ed25519") throw new Error("not an Ed25519 key")
          const publicKey = createPublicKey(privateKey)
          const raw = publicKey.export({ format: "jwk" }).x ?? ""
          return { privateKey, publicKey, kid: `local-${raw.slice(0, 16)}` }
        },
        catch: (cause) => new IssuerKeyError({ file, reason: "not an Ed25519 private key in PEM", cause }),
      }),
    ),
  )

/** Mints an ID token for `email` signed by the local issuer, valid for `ttlSeconds`. */
export const mint = (
  key: LocalIssuerKey,
  claims: { readonly email: string; readonly audience: string; readonly ttlSeconds: number },
): Effect.Effect<string> =>
  Effect.promise(() =>
    new SignJWT({ email: claims.email.toLowerCase(), email_verified: true })
      .setProtectedHeader({ alg: "EdDSA", kid: key.kid, typ: "JWT" })
      .setIssuer(localIssuerName)
      .setAudience(claims.audience)
      .setSubject(claims.email.toLowerCase())
      .setIssuedAt()
      .setExpirationTime(`${claims.ttlSeconds}s`)
      .sign(key.privateKey),
  )
