/**
 * A stand-in for the internet, for tests: a network namespace joined to the host by a veth, holding
 * a "public" address (TEST-NET-3) and one address in each range machines must not reach, with a
 * listener on ports 80 and 25 that answers `hello <address>:<port>`. The host routes each address
 * (a /32) to it and makes its veth an uplink, so machines reach it the way they would reach the
 * internet. Every address lives only inside this namespace; nothing is routed anywhere else.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { connect } from "node:net"
import { run } from "../machines/namespace/exec.ts"
import * as Policy from "./Policy.ts"

/** The stand-in's addresses by role. */
export const addresses = {
  public: "203.0.113.10",
  private10: "10.77.0.10",
  private172: "172.16.77.10",
  private192: "192.168.77.10",
  shared100: "100.64.77.10",
  metadata: "169.254.169.254",
} as const

export interface TestInternet {
  readonly netns: string
  /** The host-side veth, an uplink while the stand-in exists. */
  readonly hostIf: string
  /** The host's address on the veth (a host address machines must not reach). */
  readonly hostAddress: string
  /** Removes the listener, the namespace, the veth, its routes and its uplink element. */
  readonly close: () => Promise<void>
}

const listener = `
const net = require("node:net")
let ready = 0
for (const port of [80, 25]) {
  const server = net.createServer((s) => {
    s.on("error", () => {})
    s.end("hello " + s.localAddress + ":" + s.localPort + "\\n")
  })
  server.listen({ host: "0.0.0.0", port, backlog: 4096 }, () => { if (++ready === 2) console.log("ready") })
}
`

/** Makes the stand-in; `pool` is the machines' address range, routed back to the host. */
export const make = async (policy: Policy.PolicySettingsValue, pool: string): Promise<TestInternet> => {
  const tag = randomBytes(4).toString("hex")
  const netns = `hgtnet-${tag}`
  const hostIf = `hgt${tag}`
  const quad = Math.floor(Math.random() * 64) * 4
  const hostAddress = `198.51.100.${quad + 1}`
  const nsAddress = `198.51.100.${quad + 2}`
  let child: ChildProcess | undefined
  const close = async () => {
    await Policy.removeUplink(policy, hostIf)
    if (child?.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child?.once("exit", r))
      child.kill("SIGKILL")
      await exited
    }
    // The routes through the veth go with it.
    await run("ip", ["link", "del", hostIf]).catch(() => undefined)
    await run("ip", ["netns", "del", netns]).catch(() => undefined)
  }
  try {
    await run("ip", ["netns", "add", netns])
    await run("ip", ["-batch", "-"], {
      input: [
        `link add ${hostIf} type veth peer name eth0 netns ${netns}`,
        `addr add ${hostAddress}/30 dev ${hostIf}`,
        `link set ${hostIf} up`,
      ].join("\n"),
    })
    await run("ip", ["-n", netns, "-batch", "-"], {
      input: [
        `addr add ${nsAddress}/30 dev eth0`,
        ...Object.values(addresses).map((a) => `addr add ${a}/32 dev eth0`),
        "link set lo up",
        "link set eth0 up",
        `route add ${pool} via ${hostAddress}`,
      ].join("\n"),
    })
    await run("ip", ["-batch", "-"], {
      input: Object.values(addresses)
        .map((a) => `route add ${a}/32 via ${nsAddress} dev ${hostIf}`)
        .join("\n"),
    })
    await Policy.addUplink(policy, hostIf)
    const started = spawn("ip", ["netns", "exec", netns, process.execPath, "-e", listener], {
      stdio: ["ignore", "pipe", "inherit"],
    })
    child = started
    await new Promise<void>((ok, fail) => {
      started.stdout?.on("data", (b: Buffer) => b.toString().includes("ready") && ok())
      started.once("exit", (code) => fail(new Error(`listener exited ${code}`)))
    })
    return { netns, hostIf, hostAddress, close }
  } catch (e) {
    await close()
    throw e
  }
}

/** The first line a TCP listener at `host:port` sends, or the connection error's code. */
export const probe = (host: string, port: number) =>
  new Promise<string>((ok) => {
    const socket = connect({ host, port })
    let data = ""
    socket.setTimeout(3_000, () => {
      socket.destroy()
      ok("timeout")
    })
    socket.on("data", (b: Buffer) => {
      data += b.toString()
    })
    socket.once("end", () => ok(data.trim()))
    socket.once("close", () => ok(data.trim()))
    socket.once("error", (e: NodeJS.ErrnoException) => ok(e.code ?? e.message))
  })
