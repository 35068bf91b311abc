// Where the project's own tools live. Plain JavaScript: the bootstrap imports it before any npm
// dependency is installed. The bootstrap writes `.tools/nats-server.path` once it has found or
// fetched a nats-server that is new enough; everything that starts a nats-server reads it here.
import { existsSync, readFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

/** The repository root. */
export const root = join(dirname(fileURLToPath(import.meta.url)), "..")

/** The git-ignored folder holding fetched tools. */
export const toolsDir = join(root, ".tools")

/** The git-ignored folder holding local data (nats-server store, master key, issuer key). */
export const dataDir = join(root, ".data")

/** The file recording the chosen nats-server binary. */
export const natsServerPathFile = join(toolsDir, "nats-server.path")

/** The nats-server binary chosen by the bootstrap; throws with advice when it has not run. */
export const natsServerPath = () => {
  if (!existsSync(natsServerPathFile)) {
    throw new Error("nats-server not found: run `node deploy/bootstrap.mjs` (npm start and npm test do)")
  }
  return readFileSync(natsServerPathFile, "utf8").trim()
}
