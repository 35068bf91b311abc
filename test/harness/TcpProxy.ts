/**
 * A loopback TCP proxy a test can cut: its clients' connections are closed, and new ones refused,
 * until it is mended. What a network outage between one process and its NATS server looks like to
 * that process, while the server and its other clients go on.
 */
import net from "node:net"

/** The proxy: `url` (`nats://`) reaches the target through it. */
export interface TcpProxy {
  readonly url: string
  /** Closes every connection through it; new ones are closed as they come, until `mend`. */
  readonly cut: () => void
  /** Lets connections through again. */
  readonly mend: () => void
  readonly close: () => Promise<void>
}

/** Starts a proxy to loopback port `port` (a NATS server's) on a free loopback port. */
export const tcpProxy = async (port: number): Promise<TcpProxy> => {
  let down = false
  const sockets = new Set<net.Socket>()
  const server = net.createServer((client) => {
    if (down) return client.destroy()
    const upstream = net.connect(port, "127.0.0.1")
    const end = () => {
      client.destroy()
      upstream.destroy()
      sockets.delete(client)
      sockets.delete(upstream)
    }
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on("error", end).on("close", end)
    }
    client.pipe(upstream)
    upstream.pipe(client)
  })
  await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening))
  const { port: own } = server.address() as net.AddressInfo
  const dropAll = () => {
    for (const s of sockets) s.destroy()
    sockets.clear()
  }
  return {
    url: `nats://127.0.0.1:${own}`,
    cut: () => {
      down = true
      dropAll()
    },
    mend: () => {
      down = false
    },
    close: () =>
      new Promise<void>((closed) => {
        dropAll()
        server.close(() => closed())
      }),
  }
}
