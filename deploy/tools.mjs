// Where the project's own tools live. Plain JavaScript: the bootstrap imports it before any npm
// dependency is installed. The bootstrap writes `.tools/nats-server.path` once it has found or
// fetched a nats-server that is new enough; everything that starts a nats-server reads it here.
import { existsSync, readFileSync } from "node:fs"
import { dirname, join, resolve } from "node:path"
import { fileURLToPath } from "node:url"

/** The repository root. */
export const root = join(dirname(fileURLToPath(import.meta.url)), "..")

/**
 * The git-ignored folder holding fetched tools. `HANGAR_TOOLS_DIR` moves it (the bootstrap's own
 * test fetches into a temporary folder); this bootstrap-level file is the only reader of these
 * variables, because it must work before any npm dependency (and so `core/Config.ts`) exists.
 */
export const toolsDir = process.env.HANGAR_TOOLS_DIR
  ? resolve(process.env.HANGAR_TOOLS_DIR)
  : join(root, ".tools")

/**
 * The git-ignored folder holding local data (nats-server store, master key, issuer key).
 * `HANGAR_DATA_DIR` moves it (tests run the whole launcher in a temporary folder). The roles read
 * the same variable the same way in `core/DataDir.ts` (core never imports the launcher).
 */
export const dataDir = process.env.HANGAR_DATA_DIR
  ? resolve(process.env.HANGAR_DATA_DIR)
  : join(root, ".data")

/** The file recording the chosen nats-server binary. */
export const natsServerPathFile = join(toolsDir, "nats-server.path")

/** The nats-server binary chosen by the bootstrap; throws with advice when it has not run. */
export const natsServerPath = () => {
  if (!existsSync(natsServerPathFile)) {
    throw new Error("nats-server not found: run `node deploy/bootstrap.mjs` (npm start and npm test do)")
  }
  return readFileSync(natsServerPathFile, "utf8").trim()
}
