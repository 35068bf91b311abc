/**
 * Terminal figures (issue 22), each beside its baseline measured in the same run:
 *
 * - keystroke echo round trip (send one byte, see it echoed) through the relay (caller WebSocket →
 *   relay → NATS → host end → PTY and back), p50/p99; baseline: the same echo over a direct ssh2
 *   PTY channel to a machine made with the driver;
 * - output throughput of `head -c <MB>M /dev/zero | base64` through the relay, MB/s; baseline: the
 *   same over the direct PTY channel;
 * - `idle` sessions open at once and idle for 5 s: the process's RSS and CPU over the idle time.
 *
 * The stack runs in this process (relay, host agent, gateway, actors); the caller uses the
 * product's protocol module over `ws`. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/terminal.ts [echoes=300] [mb=50] [idle=100]
 */
import { createECDH } from "node:crypto"
import { Effect } from "effect"
import WebSocket from "ws"
import * as Protocol from "../core/Terminal.ts"
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

/** A session through the stack's relay, with the product's protocol module. */
const relayed = async (
  stack: Stack,
  acct: TestAccount,
  run: string,
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
  const ws = new WebSocket(`${result.relay_url}?route=${result.route}&side=caller`)
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

const stack = await startStack({ relay: true, hostVcpus: 2 })
try {
  const acct = await createAccount(stack)
  const fn = (await publish(stack, acct, { timeout_minutes: 30 })).function
  const run = (await startRun(stack, acct, fn)).id
  const session = await relayed(stack, acct, run)
  const through = await measure(session)
  session.close()

  // Idle sessions: opened, then 5 s of nothing.
  const sessions = []
  for (let i = 0; i < idle; i++) sessions.push(await relayed(stack, acct, run))
  await sleep(1_000)
  const rss0 = process.memoryUsage().rss
  const cpu0 = process.cpuUsage()
  await sleep(5_000)
  const cpu = process.cpuUsage(cpu0)
  const rss = process.memoryUsage().rss

  console.log(`| measure | through the relay | direct ssh2 PTY (baseline) |`)
  console.log(`|---|---|---|`)
  console.log(`| keystroke echo p50 | ${through.p50.toFixed(2)} ms | ${baseline.p50.toFixed(2)} ms |`)
  console.log(`| keystroke echo p99 | ${through.p99.toFixed(2)} ms | ${baseline.p99.toFixed(2)} ms |`)
  console.log(
    `| output of ${mb} MB of base64 | ${through.mbps.toFixed(1)} MB/s | ${baseline.mbps.toFixed(1)} MB/s |`,
  )
  console.log(
    `${idle} idle sessions (the whole stack in this process): RSS ${(rss0 / 2 ** 20).toFixed(0)} → ${(rss / 2 ** 20).toFixed(0)} MiB over 5 s, CPU ${((cpu.user + cpu.system) / 1000).toFixed(0)} ms in 5 s`,
  )
  for (const s of sessions) s.close()
  await command(stack, acct, run, "finish", { state: "failed" })
} finally {
  await closeStack(stack)
}
