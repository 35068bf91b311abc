/**
 * Loopback ports for servers a test starts itself (nats-server nodes, gateways, relays) on a port
 * it must know before the start, or keep across a restart.
 */
import { randomInt } from "node:crypto"
import { readFileSync } from "node:fs"
import net from "node:net"

/** Whether `port` can be listened on at 127.0.0.1 now. */
const bindable = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const server = net.createServer()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

/** The kernel's ephemeral port range (`ip_local_port_range`); Linux's default when unreadable. */
const ephemeralRange = (): readonly [number, number] => {
  try {
    const [low, high] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)
    if (Number(low) > 0 && Number(high) >= Number(low)) return [Number(low), Number(high)]
  } catch {}
  return [32768, 60999]
}

/**
 * A free loopback port for a server started right after (closed again at once), picked outside the
 * kernel's ephemeral range: a port from that range, once closed, can be taken by any outgoing
 * connection's local end or `listen(0)` on the machine before the server binds it (the server then
 * exits at start with EADDRINUSE: one possible cause of a cluster node that exited at start once
 * under the full suite; a node killed before its cluster's JetStream answered is another, seen
 * since: `NatsCluster.ts`), and again before a node killed in a test is restarted on it. Ports
 * outside it are taken only by an explicit bind.
 */
export const freePort = async (): Promise<number> => {
  const [low, high] = ephemeralRange()
  const below = Math.max(0, low - 10_000)
  const above = Math.max(0, 65_535 - high)
  for (let tries = 0; tries < 50 && below + above > 0; tries++) {
    const pick = randomInt(below + above)
    const port = pick < below ? 10_000 + pick : high + 1 + (pick - below)
    if (await bindable(port)) return port
  }
  throw new Error(`no free loopback port outside the ephemeral range ${low}-${high}`)
}
