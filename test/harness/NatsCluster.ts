/**
 * A real 3-node (or n-node) JetStream cluster for a test file: each node a nats-server of
 * `startNatsServer` (its own temporary store, random client port, store encrypted with the
 * cluster's one random key), joined by routes on cluster ports picked once, so a node killed and
 * restarted comes back on the same client and route ports and its own store, as a machine that
 * rebooted would. The config is the one `deploy/cluster/` documents, with test ports.
 */
import { randomBytes } from "node:crypto"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { Redacted } from "effect"
import { type StartedNatsServer, startNatsServer } from "./NatsServer.ts"
import { freePort } from "./Ports.ts"

/**
 * Actor leases for a stack on a test cluster. The test stack's own (1.5 s, renewed every 300 ms,
 * so a killed worker's partitions move at once) are about a hundred R3 writes a second per worker;
 * on a 2-core machine running three nodes beside every role, a stall of a second let leases lapse,
 * and both workers took each other's partitions in turn while runs waited for minutes (their
 * bills too: the chaos file's ledger check failed so once). 6 s renewed every 1.5 s, in
 * production's proportion (10 s, every 3.3 s).
 */
export const clusterLeases = { ACTOR_LEASE_MS: 6_000, ACTOR_RENEW_MS: 1_500 } as const

/** A running cluster. */
export interface NatsCluster {
  /** The nodes' client URLs, comma-separated, as `HANGAR_NATS_URL` takes them. */
  readonly url: string
  readonly nodes: ReadonlyArray<StartedNatsServer>
  /** Stops every node (idempotent). */
  readonly stop: () => Promise<void>
}

/** The `cluster` block of node `index` (0-based) among route ports `routePorts`. */
export const clusterBlock = (name: string, routePorts: ReadonlyArray<number>, index: number): string =>
  [
    "cluster {",
    `  name: ${JSON.stringify(name)}`,
    `  listen: "127.0.0.1:${routePorts[index]}"`,
    "  routes: [",
    ...routePorts.filter((_, i) => i !== index).map((p) => `    "nats-route://127.0.0.1:${p}"`),
    "  ]",
    "}",
  ].join("\n")

/**
 * Waits until JetStream answers on every node (`$JS.API.INFO`: the node's JetStream started and
 * the cluster's meta leader elected). A node killed before that, while it still writes its first
 * JetStream state, can be left with a file it refuses at its next start ("corrupt state file",
 * seen once under a loaded suite; nats-server issue 4195 is the same kind): the tests kill nodes
 * of a formed cluster, as a crash in production would.
 */
const untilJetStreamAnswers = async (urls: ReadonlyArray<string>, timeoutMs = 60_000) => {
  const deadline = Date.now() + timeoutMs
  for (const url of urls) {
    const nc = await connect({ servers: url, name: "cluster-ready" })
    try {
      const jsm = await jetstreamManager(nc, { checkAPI: false })
      for (;;) {
        const answered = await jsm.getAccountInfo().then(
          () => true,
          (e: unknown) => {
            if (Date.now() > deadline)
              throw new Error(`JetStream did not answer on ${url} in ${timeoutMs} ms: ${String(e)}`)
            return false
          },
        )
        if (answered) break
        await new Promise((r) => setTimeout(r, 100))
      }
    } finally {
      await nc.close()
    }
  }
}

/** Starts `size` nodes (default 3) and answers once each listens and JetStream answers on each. */
export const startNatsCluster = async (size = 3): Promise<NatsCluster> => {
  const name = `hangar-test-${randomBytes(4).toString("hex")}`
  const routePorts = await Promise.all(Array.from({ length: size }, freePort))
  const storeKey = Redacted.make(randomBytes(32).toString("hex"))
  const nodes: Array<StartedNatsServer> = []
  const stop = async () => {
    await Promise.all(nodes.map((n) => n.stop()))
  }
  try {
    for (let i = 0; i < size; i++)
      nodes.push(
        await startNatsServer({
          serverName: `${name}-n${i + 1}`,
          storeKey,
          extraConfig: clusterBlock(name, routePorts, i),
        }),
      )
    await untilJetStreamAnswers(nodes.map((n) => n.url))
  } catch (e) {
    await stop()
    throw e
  }
  return { url: nodes.map((n) => n.url).join(","), nodes, stop }
}
