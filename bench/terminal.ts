/**
 * Terminal figures (issue 22), each beside its baseline measured in the same run:
 *
 * - keystroke echo round trip (send one byte, see it echoed) through the relay (caller WebSocket →
 *   relay → NATS → host end → PTY and back), p50/p99; baseline: the same echo over a direct ssh2
 *   PTY channel to a machine made with the driver;
 * - output throughput of `head -c <MB>M /dev/zero | base64` through the relay, MB/s; baseline: the
 *   same over the direct PTY channel;
 * - `idle` sessions open at once, half through each of two relays: each relay's RSS and CPU (from
 *   `/proc`) over 10 s with no session, then over 10 s with its half open and idle, beside this
 *   process's (the rest of the stack), and how many sessions are still open after it (heartbeats
 *   go on: `HANGAR_TERMINAL_HEARTBEAT_MS`, default 10 s, reaches both relays and the host agent).
 *
 * The two relays run as deployed, each in a process of its own (`hangar serve relay`), so their
 * figures are their own; the rest of the stack (host agent, gateway, actors) runs in this process.
 * The caller uses the product's protocol module over `ws`. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/terminal.ts [echoes=300] [mb=50] [idle=100]
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { createECDH } from "node:crypto"
import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import WebSocket from "ws"
import * as Protocol from "../core/Terminal.ts"
import { root } from "../deploy/tools.mjs"
import { testGuest } from "../host-agent/guest/testing.ts"
import {
  closeStack,
  command,
  createAccount,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "../test/harness/Stack.ts"

const echoes = Number(process.argv[2] ?? 300)
const mb = Number(process.argv[3] ?? 50)
const idle = Number(process.argv[4] ?? 100)

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** A byte channel with echo and throughput measures over it. */
interface Channel {
  readonly write: (data: Buffer) => void
  /** Called with every chunk of output. */
  onData: (data: Buffer) => void
  readonly close: () => void
}

const measure = async (channel: Channel) => {
  // Quiet prompt, no line editing: a byte typed comes straight back. What that prints is dropped.
  channel.onData = () => {}
  channel.write(Buffer.from("PS1=; stty -icanon\n"))
  await sleep(500)
  const rtts: Array<number> = []
  for (let i = 0; i < echoes; i++) {
    const byte = String.fromCharCode(97 + (i % 26))
    const got = new Promise<void>((ok) => {
      channel.onData = (d) => {
        if (d.toString("latin1").includes(byte)) ok()
      }
    })
    const t0 = performance.now()
    channel.write(Buffer.from(byte))
    await got
    rtts.push(performance.now() - t0)
  }
  channel.write(Buffer.from("\u0015stty icanon\n"))
  await sleep(300)
  // Throughput: count bytes until the end mark.
  let bytes = 0
  const done = new Promise<void>((ok) => {
    let tail = ""
    channel.onData = (d) => {
      bytes += d.length
      tail = (tail + d.toString("latin1")).slice(-64)
      if (tail.includes("THROUGHPUT-END")) ok()
    }
  })
  const t0 = performance.now()
  // The end mark is printed by printf, so the typed line's echo does not hold it.
  channel.write(Buffer.from(`head -c ${mb}M /dev/zero | base64; printf '%s-%s\\n' THROUGHPUT END\n`))
  await done
  const seconds = (performance.now() - t0) / 1000
  return { p50: pct(rtts, 50), p99: pct(rtts, 99), mbps: bytes / 1e6 / seconds }
}

/** A relay in a process of its own (`hangar serve relay`) on the stack's NATS and storage. */
interface RelayProcess {
  readonly url: string
  readonly child: ChildProcess
}

const spawnRelay = (stack: Stack): Promise<RelayProcess> =>
  new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ["--import", "tsx", join(root, "cli", "main.ts"), "serve", "relay"],
      {
        cwd: root,
        env: {
          ...process.env,
          ...Object.fromEntries(Object.entries(stack.env).map(([k, v]) => [`HANGAR_${k}`, v])),
          HANGAR_RELAY_ADDR: "127.0.0.1:0",
        },
        stdio: ["ignore", "ignore", "pipe"],
      },
    )
    // Its log until it listens (then its port is known), for the error if it never does.
    let text = ""
    let up = false
    child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
      if (up) return
      text += chunk
      const port = /"msg":"relay listening".*"port":(\d+)/.exec(text)?.[1]
      if (port === undefined) return
      up = true
      resolve({ url: `ws://127.0.0.1:${port}/terminal`, child })
    })
    child.once("exit", (code, signal) => reject(new Error(`relay exited (${code ?? signal}): ${text}`)))
  })

const stopRelay = ({ child }: RelayProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    const force = setTimeout(() => child.kill("SIGKILL"), 10_000)
    child.once("exit", () => {
      clearTimeout(force)
      resolve()
    })
    child.kill("SIGTERM")
  })

/**
 * A process's resident memory (bytes) and CPU time so far (ms, every thread's, from the
 * scheduler's nanosecond counts, finer than `/proc/<pid>/stat`'s ticks).
 */
const usageOf = (pid: number) => {
  const rss = Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) * 1024
  let ns = 0
  for (const task of readdirSync(`/proc/${pid}/task`))
    ns += Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, "utf8").split(" ")[0])
  return { rss, cpuMs: ns / 1e6 }
}
const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(0)

/** A session through the relay at `url`, with the product's protocol module. */
const relayed = async (
  stack: Stack,
  acct: TestAccount,
  run: string,
  url: string,
): Promise<Channel & { ws: WebSocket }> => {
  const ecdh = createECDH("prime256v1")
  const callerPublic = ecdh.generateKeys()
  const done = await command(stack, acct, run, "terminal", {
    rows: 50,
    cols: 200,
    public_key: callerPublic.toString("base64url"),
  })
  const result = done.result as { relay_url: string; route: string; public_key: string }
  const hostPublic = Buffer.from(result.public_key, "base64url")
  const keys = Protocol.sessionKeys(ecdh, hostPublic, callerPublic, hostPublic)
  const ws = new WebSocket(`${url}?route=${result.route}&side=caller`)
  let out = 0n
  let inbound = 0n
  const channel = {
    ws,
    onData: (_d: Buffer) => {},
    write: (data: Buffer) => ws.send(Protocol.seal(keys.callerToHost, Protocol.Kind.input, out++, data)),
    close: () => ws.close(),
  }
  // Listening before the socket opens: what the shell printed meanwhile comes right at the open.
  ws.on("message", (frame: Buffer) => {
    const opened = Protocol.open(keys.hostToCaller, frame, inbound++)
    if ("data" in opened && opened.kind === Protocol.Kind.output) channel.onData(opened.data)
  })
  await new Promise((ok, fail) => {
    ws.on("open", ok)
    ws.on("error", fail)
  })
  return channel
}

// Baseline: a PTY channel straight over ssh2 to a machine made with the driver.
const bare = await testGuest("termbench", { memoryBytes: 2 * 1024 ** 3 })
const direct = await Effect.runPromise(
  bare.guest.channel("exec -l /bin/bash", {
    pty: { rows: 50, cols: 200, height: 0, width: 0, term: "xterm" },
  }),
)
const directChannel: Channel = {
  onData: () => {},
  write: (d) => direct.channel.write(d),
  close: () => direct.channel.close(),
}
direct.channel.on("data", (d: Buffer) => directChannel.onData(d))
const baseline = await measure(directChannel)
directChannel.close()
await bare.close()

// The stack's own relay is left out: callers go to the two relay processes instead.
const stack = await startStack({ hostVcpus: 2 })
const relays: Array<RelayProcess> = []
try {
  relays.push(await spawnRelay(stack), await spawnRelay(stack))
  const [a, b] = relays as [RelayProcess, RelayProcess]
  const pids = [a.child.pid as number, b.child.pid as number, process.pid]
  const acct = await createAccount(stack)
  const fn = (await publish(stack, acct, { timeout_minutes: 30 })).function
  const run = (await startRun(stack, acct, fn)).id
  /** Each process's RSS at the end and CPU over 10 s of nothing. */
  const idleFor10s = async () => {
    const before = pids.map(usageOf)
    await sleep(10_000)
    return pids.map(usageOf).map((u, i) => ({ rss: u.rss, cpuMs: u.cpuMs - (before[i] as typeof u).cpuMs }))
  }

  // First the idle figures (before any output went through a relay, so none of its garbage is
  // collected in them): 10 s with no session, then 10 s with `idle` sessions open, half on each.
  await sleep(1_000)
  const none = await idleFor10s()
  const sessions = []
  for (let i = 0; i < idle; i++) sessions.push(await relayed(stack, acct, run, i % 2 === 0 ? a.url : b.url))
  await sleep(1_000)
  const busy = await idleFor10s()
  const open = sessions.filter((s) => s.ws.readyState === WebSocket.OPEN).length
  for (const s of sessions) s.close()
  // Their shells go before the echo and output are measured.
  await sleep(2_000)

  const session = await relayed(stack, acct, run, a.url)
  const through = await measure(session)
  session.close()

  // The ceiling under both: the same output through a local PTY with no ssh and no relay
  // (`script` reads the PTY's master as fast as the kernel fills it).
  const ptyStarted = performance.now()
  const pty = spawnSync("script", ["-qc", `head -c ${mb}M /dev/zero | base64`, "/dev/null"], {
    maxBuffer: 4 * mb * 1024 * 1024,
  })
  const ptyMbps = (pty.stdout?.length ?? 0) / 1e6 / ((performance.now() - ptyStarted) / 1000)

  console.log(`| measure | through a relay | direct ssh2 PTY (baseline) |`)
  console.log(`|---|---|---|`)
  console.log(`| keystroke echo p50 | ${through.p50.toFixed(2)} ms | ${baseline.p50.toFixed(2)} ms |`)
  console.log(`| keystroke echo p99 | ${through.p99.toFixed(2)} ms | ${baseline.p99.toFixed(2)} ms |`)
  console.log(
    `| output of ${mb} MB of base64 | ${through.mbps.toFixed(1)} MB/s | ${baseline.mbps.toFixed(1)} MB/s |`,
  )
  console.log(
    `| the same through a local PTY, no ssh (the kernel's ceiling here) | | ${ptyMbps.toFixed(1)} MB/s |`,
  )
  console.log()
  console.log(`${idle} idle sessions, 10 s (${open} still open after it), beside 10 s with none:`)
  console.log(`| process | sessions | RSS: none → idle sessions | CPU in 10 s: none → idle sessions |`)
  console.log(`|---|---|---|---|`)
  const names = ["relay 1", "relay 2", "rest of the stack (this process)"]
  const counts = [Math.ceil(idle / 2), Math.floor(idle / 2), idle]
  for (let i = 0; i < 3; i++) {
    const [n, s] = [none[i], busy[i]] as [(typeof none)[number], (typeof none)[number]]
    console.log(
      `| ${names[i]} | ${counts[i]} | ${mib(n.rss)} → ${mib(s.rss)} MiB | ${n.cpuMs.toFixed(1)} → ${s.cpuMs.toFixed(1)} ms |`,
    )
  }
  await command(stack, acct, run, "finish", { state: "failed" })
} finally {
  for (const r of relays) await stopRelay(r)
  await closeStack(stack)
}
