#!/usr/bin/env node
/**
 * A developer's stand-in for three machines: starts the three nodes of `deploy/cluster/` on
 * loopback (clients 4231–4233, routes 6231–6233), each with its own store under
 * `<data folder>/cluster/node-N`, waits until each listens, prints the `HANGAR_NATS_URL` to give
 * the roles, and stops them (SIGTERM, SIGKILL after 10 s) on Ctrl-C or SIGTERM. Plain JavaScript
 * on Node's own modules, like the bootstrap: `node deploy/cluster/run.mjs`.
 *
 * The store is encrypted as the single node's is: the key is `HANGAR_NATS_STORE_KEY`, else
 * `<data folder>/cluster/nats-store.key` (made once, 0600), and reaches the servers through their
 * environment in the form `deploy/NatsProcess.ts` gives it (`serverKeyOf`).
 */
import { spawn } from "node:child_process"
import { createHash, randomBytes } from "node:crypto"
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { connect } from "node:net"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { dataDir, natsServerPath } from "../tools.mjs"

const here = dirname(fileURLToPath(import.meta.url))
const nodes = [1, 2, 3]
const clusterDir = join(dataDir, "cluster")
mkdirSync(clusterDir, { recursive: true })

const storeKey = () => {
  if (process.env.HANGAR_NATS_STORE_KEY) return process.env.HANGAR_NATS_STORE_KEY
  const file = join(clusterDir, "nats-store.key")
  if (!existsSync(file)) writeFileSync(file, randomBytes(32).toString("hex"), { mode: 0o600, flag: "wx" })
  return readFileSync(file, "utf8").trim()
}
// As `serverKeyOf` in deploy/NatsProcess.ts: the server reads a variable as config syntax, so it
// gets `k` and 64 hex digits, which that syntax leaves alone.
const serverKey = `k${createHash("sha256").update("hangar/nats-store/v1\0").update(storeKey()).digest("hex")}`

const listening = (port) =>
  new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port })
    socket.once("connect", () => {
      socket.destroy()
      resolve(true)
    })
    socket.once("error", () => resolve(false))
  })

const binary = natsServerPath()
const children = nodes.map((n) => {
  const storeDir = join(clusterDir, `node-${n}`)
  mkdirSync(storeDir, { recursive: true })
  const child = spawn(binary, ["-c", join(here, `node-${n}.conf`)], {
    stdio: ["ignore", "inherit", "inherit"],
    env: {
      ...process.env,
      HANGAR_CLUSTER_STORE_DIR: JSON.stringify(storeDir),
      HANGAR_CLUSTER_PID_FILE: JSON.stringify(join(clusterDir, `node-${n}.pid`)),
      HANGAR_NATS_STORE_KEY_FOR_SERVER: serverKey,
    },
  })
  child.once("exit", (code, signal) => {
    if (!stopping) console.error(`node ${n} exited (${code ?? signal}); stopping the others`)
    stop(1)
  })
  return child
})

let stopping = false
function stop(code) {
  if (stopping) return
  stopping = true
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGTERM")
  const force = setTimeout(() => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL")
  }, 10_000)
  force.unref()
  Promise.all(
    children.map((c) =>
      c.exitCode !== null || c.signalCode !== null ? undefined : new Promise((r) => c.once("exit", r)),
    ),
  ).then(() => process.exit(code))
}
process.once("SIGINT", () => stop(0))
process.once("SIGTERM", () => stop(0))

const deadline = Date.now() + 20_000
for (const n of nodes) {
  while (!(await listening(4230 + n))) {
    if (stopping) break
    if (Date.now() > deadline) {
      console.error(`node ${n} does not listen on 127.0.0.1:${4230 + n} after 20 s`)
      stop(1)
      break
    }
    await new Promise((r) => setTimeout(r, 100))
  }
}
if (!stopping) {
  const url = nodes.map((n) => `nats://127.0.0.1:${4230 + n}`).join(",")
  console.log(`cluster up; run the roles with:\n  HANGAR_NATS_URL=${url} HANGAR_NATS_REPLICAS=3`)
}
