/**
 * Where the service keeps local state by default (the local nats-server's store, the master key,
 * the issuer key, the link key): `.data/` at the repository's root, or `HANGAR_DATA_DIR`.
 * `deploy/tools.mjs` (the launcher, which runs before any npm dependency exists) reads the same
 * variable the same way; core never imports the launcher.
 */
import { join, resolve } from "node:path"
import { fileURLToPath } from "node:url"

/** The repository's root folder. */
export const repositoryRoot: string = fileURLToPath(new URL("..", import.meta.url))

/** The local data folder. */
export const dataDir: string = process.env.HANGAR_DATA_DIR
  ? resolve(process.env.HANGAR_DATA_DIR)
  : join(repositoryRoot, ".data")
