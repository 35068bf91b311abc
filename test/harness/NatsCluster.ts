/**
 * A real 3-node (or n-node) JetStream cluster for a test file: each node a nats-server of
 * `startNatsServer` (its own temporary store, random client port, store encrypted with the
 * cluster's one random key), joined by routes on cluster ports picked once, so a node killed and
 * restarted comes back on the same client and route ports and its own store, as a machine that
 * rebooted would. The config is the one `deploy/cluster/` documents, with test ports.
 */
import { randomBytes } from "node:crypto"
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

/** Starts `size` nodes (default 3) and answers once each listens (the cluster forms on its own). */
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
  } catch (e) {
    await stop()
    throw e
  }
  return { url: nodes.map((n) => n.url).join(","), nodes, stop }
}
