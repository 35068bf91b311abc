/**
 * The terminal through the real stack: gateway, relay, host agent, a real machine. The caller here
 * is written from the spec's "Terminal session protocol" alone (its own ECDH, HKDF and AES-GCM with
 * node:crypto; nothing of `core/Terminal.ts`), over a real WebSocket (`ws`).
 */
import { createCipheriv, createDecipheriv, createECDH, createHash, hkdfSync, randomBytes } from "node:crypto"
import { connect as connectNats, type NatsConnection } from "@nats-io/transport-node"
import { Effect, Exit, Layer, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import WebSocket from "ws"
import * as Nats from "../core/Nats.ts"
import * as Storage from "../core/Storage.ts"
import { TerminalSettings } from "../core/TerminalSettings.ts"
import * as Relay from "../relay/Relay.ts"
import { storageNames } from "../schema/Subjects.ts"
import {
  closeStack,
  command,
  createAccount,
  type Json,
  leftoversOnceGone,
  publish,
  runLog,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

const LABEL = "service-terminal-v1"
/** Short heartbeats, so a vanished relay or host end is noticed within about a second. */
const HEARTBEAT_MS = 300
/** A short billed minute, so a run's timeout (`timeout_minutes` of them) comes within seconds. */
const MINUTE_MS = 3_000

/** The caller's end of one session, from the spec. */
interface Caller {
  readonly ws: WebSocket
  /** Everything the shell printed so far (opened frames of kind 2). */
  output: string
  /** The exit status frame's number, once it came. */
  exitStatus?: number
  /** How the socket closed, once it did. */
  readonly closed: Promise<{ code: number; reason: string }>
  readonly send: (kind: number, data: Buffer) => void
  /** Sends a frame exactly as given (for the tests that break the protocol). */
  readonly sendRaw: (frame: Buffer) => void
  readonly seal: (kind: number, sequence: bigint, data: Buffer) => Buffer
  readonly until: (text: string) => Promise<void>
}

const frameOf = (key: Buffer, kind: number, sequence: bigint, data: Buffer) => {
  const header = Buffer.alloc(9)
  header[0] = kind
  header.writeBigUInt64BE(sequence, 1)
  const nonce = Buffer.concat([Buffer.alloc(4), header.subarray(1)])
  const cipher = createCipheriv("aes-256-gcm", key, nonce)
  cipher.setAAD(header)
  return Buffer.concat([header, cipher.update(data), cipher.final(), cipher.getAuthTag()])
}

let stack: Stack
let acct: TestAccount
let fn: string

beforeAll(async () => {
  stack = await startStack({
    relay: true,
    minuteMs: MINUTE_MS,
    settings: { TERMINAL_JOIN_WAIT_MS: 3_000, TERMINAL_HEARTBEAT_MS: HEARTBEAT_MS },
  })
  acct = await createAccount(stack)
  fn = (await publish(stack, acct, { timeout_minutes: 600 })).function
}, 120_000)

afterAll(() => closeStack(stack), 120_000)

/** Sends a `terminal` command for `run` with a fresh caller key; answers the key and the result. */
const openTerminal = async (run: string, extra: Record<string, unknown> = {}) => {
  const ecdh = createECDH("prime256v1")
  const callerPublic = ecdh.generateKeys()
  const done = await command(stack, acct, run, "terminal", {
    rows: 24,
    cols: 80,
    public_key: callerPublic.toString("base64url"),
    ...extra,
  })
  expect(done, JSON.stringify(done)).toMatchObject({ state: "succeeded" })
  const result = done.result as { relay_url: string; route: string; public_key: string }
  const hostPublic = Buffer.from(result.public_key, "base64url")
  const secret = ecdh.computeSecret(hostPublic)
  const salt = createHash("sha256")
    .update(Buffer.concat([Buffer.from(LABEL), Buffer.from([0]), callerPublic, hostPublic]))
    .digest()
  const keys = Buffer.from(hkdfSync("sha256", secret, salt, Buffer.from(`${LABEL} keys`), 64))
  return { result, toHost: keys.subarray(0, 32), toCaller: keys.subarray(32) }
}

/** Connects to `url` as the caller of `route` with the session's keys. */
const connect = (url: string, route: string, toHost: Buffer, toCaller: Buffer): Promise<Caller> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(`${url}?route=${route}&side=caller`)
    let sent = 0n
    let received = 0n
    let resolveClosed: (c: { code: number; reason: string }) => void = () => {}
    const waiters = new Set<() => void>()
    const caller: Caller = {
      ws,
      output: "",
      closed: new Promise((r) => {
        resolveClosed = r
      }),
      send: (kind, data) => ws.send(frameOf(toHost, kind, sent++, data)),
      sendRaw: (frame) => ws.send(frame),
      seal: (kind, sequence, data) => frameOf(toHost, kind, sequence, data),
      until: (text) =>
        new Promise<void>((ok, fail) => {
          const timer = setTimeout(
            () => fail(new Error(`never saw ${JSON.stringify(text)} in ${JSON.stringify(caller.output)}`)),
            20_000,
          )
          const check = () => {
            if (!caller.output.includes(text)) return
            clearTimeout(timer)
            waiters.delete(check)
            ok()
          }
          waiters.add(check)
          check()
        }),
    }
    ws.on("message", (data: Buffer) => {
      const kind = data[0] as number
      const sequence = data.readBigUInt64BE(1)
      expect(sequence).toBe(received)
      received++
      const header = data.subarray(0, 9)
      const decipher = createDecipheriv(
        "aes-256-gcm",
        toCaller,
        Buffer.concat([Buffer.alloc(4), header.subarray(1)]),
      )
      decipher.setAAD(header)
      decipher.setAuthTag(data.subarray(data.length - 16))
      const plain = Buffer.concat([decipher.update(data.subarray(9, data.length - 16)), decipher.final()])
      if (kind === 2) caller.output += plain.toString("utf8")
      else if (kind === 4) caller.exitStatus = plain.readInt32BE(0)
      for (const w of [...waiters]) w()
    })
    ws.on("open", () => resolve(caller))
    ws.on("unexpected-response", (_req, res) => reject(new Error(`refused: ${res.statusCode}`)))
    ws.on("error", reject)
    ws.on("close", (code, reason) => resolveClosed({ code, reason: reason.toString("utf8") }))
  })

const refusalOf = (url: string) =>
  new Promise<number>((resolve) => {
    const ws = new WebSocket(url)
    ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0))
    ws.on("open", () => {
      ws.close()
      resolve(101)
    })
    ws.on("error", () => undefined)
  })

/** `p`, or a failure naming `what` after 30 s: a wait of a long test that says where it hung. */
const within = <T>(p: Promise<T>, what: string): Promise<T> =>
  new Promise<T>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`${what}: not within 30 s`)), 30_000)
    p.then(
      (v) => {
        clearTimeout(timer)
        ok(v)
      },
      (e) => {
        clearTimeout(timer)
        fail(e)
      },
    )
  })

/** The run's whole log, once its last part (with the `end` line) is stored, or after 30 s. */
const logOf = (run: string): Promise<Array<Json>> => runLog(stack, acct, run)

/** The route's core NATS subject `part`, as the relay and the host end name it. */
const routeSubject = (route: string, part: "join" | "in" | "out") =>
  storageNames(stack.prefix).subjects.terminal(route, part)

/** Collects the notes (kind 0) sent on `subject`, as their text; `closed` settles at a `close` note. */
const notesOn = (nc: NatsConnection, subject: string) => {
  const notes: Array<string> = []
  let told: () => void = () => {}
  const closed = new Promise<void>((resolve) => {
    told = resolve
  })
  nc.subscribe(subject, {
    callback: (_e, m) => {
      if (m.data[0] !== 0) return
      const text = Buffer.from(m.data.subarray(1)).toString("utf8")
      notes.push(text)
      if (text.startsWith("close ")) told()
    },
  })
  return { notes, closed }
}

/** How many login shells (`-/bin/bash`: `exec -l`, what a terminal runs) are in `run`'s machine. */
const shellsIn = async (run: string) =>
  (
    await command(stack, acct, run, "bash", {
      command:
        "for p in /proc/[0-9]*; do { tr '\\0' ' ' < $p/cmdline; } 2>/dev/null; echo; done | grep -c '^-[^ ]*bash ' || true",
    })
  ).result.output.trim()

/** The count of login shells in `run` once it is back to `count` (a closed session's shell takes a moment to go), or after 20 s. */
const shellsBackTo = async (run: string, count: string) => {
  const deadline = Date.now() + 20_000
  for (;;) {
    const now = await shellsIn(run)
    if (now === count || Date.now() > deadline) return now
    await new Promise((r) => setTimeout(r, 200))
  }
}

describe("terminal", () => {
  it("a login shell in /workspace with the run's variables: 42 and exit status 3; resize shows in stty", async () => {
    // Everything that crosses NATS for terminals, to look for what was typed and shown.
    const crossed: Array<Buffer> = []
    const watcher = await connectNats({ servers: stack.natsUrl })
    watcher.subscribe(`${stack.prefix}.term.>`, {
      callback: (_e, m) => {
        crossed.push(Buffer.from(m.data))
      },
    })
    await watcher.flush()
    const run = (await startRun(stack, acct, fn)).id
    const { result, toHost, toCaller } = await openTerminal(run, { env: { GREETING: "hello" } })
    expect(result.relay_url).toBe(stack.relayUrl)
    expect(result.route).toMatch(/^[A-Za-z0-9_-]{22}$/)
    const caller = await connect(result.relay_url, result.route, toHost, toCaller)
    const canary = `canary-${randomBytes(8).toString("hex")}`
    caller.send(1, Buffer.from(`echo $((6*7)) $GREETING $(pwd) ${canary}; stty size\n`))
    await caller.until("42 hello /workspace")
    await caller.until(canary)
    await caller.until("24 80")
    const resize = Buffer.alloc(4)
    resize.writeUInt16BE(40, 0)
    resize.writeUInt16BE(132, 2)
    caller.send(3, resize)
    caller.send(1, Buffer.from("stty size; exit 3\n"))
    await caller.until("40 132")
    expect(await caller.closed).toEqual({ code: 1000, reason: "the shell exited" })
    expect(caller.exitStatus).toBe(3)
    // The log says a terminal opened and closed, and with what status; not what it showed.
    await command(stack, acct, run, "finish", { state: "failed" })
    await waitRun(stack, acct, run)
    const log = await logOf(run)
    expect(log.filter((l) => l.kind === "terminal").map((l) => [l.state, l.exit_status])).toEqual([
      ["opened", undefined],
      ["closed", 3],
    ])
    // The canary was typed and shown, and crossed NATS sealed only; no log line holds it.
    expect(crossed.length).toBeGreaterThan(4)
    expect(Buffer.concat(crossed).includes(canary)).toBe(false)
    expect(JSON.stringify(log)).not.toContain(canary)
    expect(stack.lines.some((l) => l.line.includes(canary))).toBe(false)
    await watcher.close()
  }, 120_000)

  it("any relay serves any route: a second relay instance joins the caller to the same host end", async () => {
    const scope = Effect.runSync(Scope.make())
    try {
      // Its own connection and settings, held open for the test (a layer provided to one effect
      // would close with it).
      const context = await Effect.runPromise(
        Layer.buildWithScope(
          Layer.merge(
            TerminalSettings.layer({ relayAddr: "127.0.0.1:0", heartbeatMs: HEARTBEAT_MS }),
            Storage.layerPrefix(stack.prefix).pipe(Layer.provideMerge(Nats.layerUrl(stack.natsUrl))),
          ),
          scope,
        ),
      )
      const port = await Effect.runPromise(Relay.make.pipe(Effect.provide(context), Scope.extend(scope)))
      const run = (await startRun(stack, acct, fn)).id
      const { result, toHost, toCaller } = await openTerminal(run)
      const caller = await connect(`ws://127.0.0.1:${port}/terminal`, result.route, toHost, toCaller)
      caller.send(1, Buffer.from("echo other-$((2+3)); exit\n"))
      await caller.until("other-5")
      expect((await caller.closed).code).toBe(1000)
      expect(caller.exitStatus).toBe(0)
      await command(stack, acct, run, "finish", { state: "failed" })
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  }, 120_000)

  it("refuses what breaks the protocol: a second caller, an unknown route, a wrong side, a tampered, replayed or oversized frame", async () => {
    const run = (await startRun(stack, acct, fn)).id
    expect(await refusalOf(`${stack.relayUrl}?route=${"A".repeat(22)}&side=caller`)).toBe(404)
    expect(await refusalOf(`${stack.relayUrl}?route=short&side=caller`)).toBe(404)
    const before = await shellsIn(run)
    expect(before).toBe("0")
    for (const breaking of ["tampered", "replayed", "oversized", "unknown kind"] as const) {
      const { result, toHost, toCaller } = await openTerminal(run)
      expect(await refusalOf(`${result.relay_url}?route=${result.route}&side=host`)).toBe(400)
      const caller = await connect(result.relay_url, result.route, toHost, toCaller)
      // One caller per route.
      expect(await refusalOf(`${result.relay_url}?route=${result.route}&side=caller`)).toBe(409)
      caller.send(1, Buffer.from("echo ready\n"))
      await caller.until("ready")
      expect(await shellsIn(run)).toBe("1")
      if (breaking === "tampered") {
        const frame = caller.seal(1, 1n, Buffer.from("echo never\n"))
        frame[12] = (frame[12] as number) ^ 1
        caller.sendRaw(frame)
        expect(await caller.closed).toEqual({ code: 1008, reason: "frame does not open" })
      } else if (breaking === "replayed") {
        caller.sendRaw(caller.seal(1, 0n, Buffer.from("echo again\n")))
        expect(await caller.closed).toMatchObject({
          code: 1008,
          reason: expect.stringContaining("out of sequence"),
        })
      } else if (breaking === "oversized") {
        caller.sendRaw(Buffer.concat([caller.seal(1, 1n, Buffer.alloc(32 * 1024 - 25)), Buffer.alloc(1)]))
        expect((await caller.closed).code).toBe(1009)
      } else {
        caller.sendRaw(caller.seal(2, 1n, Buffer.from("x")))
        expect(await caller.closed).toEqual({ code: 1008, reason: "frame of unknown kind 2" })
      }
      expect(caller.output).not.toContain("never")
    }
    // Each session's shell is gone.
    expect(await shellsBackTo(run, before)).toBe(before)
    await command(stack, acct, run, "finish", { state: "failed" })
  }, 180_000)

  it("a flood of input past the bound ends the session, not the run: later commands and terminals work", async () => {
    const run = (await startRun(stack, acct, fn)).id
    for (let round = 0; round < 3; round++) {
      const { result, toHost, toCaller } = await openTerminal(run)
      const caller = await connect(result.relay_url, result.route, toHost, toCaller)
      // A shell that takes no input: its terminal out of canonical mode, so it holds a few KiB
      // and then pushes back (in canonical mode a terminal with a full line takes any amount,
      // discarding it, about 3 MB/s here, which made the overflow a race with the flood).
      caller.send(1, Buffer.from("stty -icanon -echo; echo asleep; sleep 600\n"))
      await caller.until("asleep")
      const chunk = Buffer.alloc(32 * 1024 - 25, 0x61)
      const n = [512, 200, 250][round] as number
      for (let i = 0; i < n; i++) caller.send(1, chunk)
      if (n > 256)
        expect(await within(caller.closed, `round ${round}: the session's close`)).toEqual({
          code: 1008,
          reason: "input came faster than the shell took it",
        })
      else {
        await new Promise((r) => setTimeout(r, 1500))
        caller.ws.close()
        await within(caller.closed, `round ${round}: the caller's own close`)
      }
      const after = await command(stack, acct, run, "bash", { command: "echo alive" })
      expect(after, JSON.stringify(after)).toMatchObject({
        state: "succeeded",
        result: { output: "alive\n" },
      })
    }
    const again = await openTerminal(run)
    const caller = await connect(again.result.relay_url, again.result.route, again.toHost, again.toCaller)
    caller.send(1, Buffer.from("echo back-$((1+1)); exit 4\n"))
    await caller.until("back-2")
    expect((await within(caller.closed, "the last terminal's close")).code).toBe(1000)
    expect(caller.exitStatus).toBe(4)
    await command(stack, acct, run, "finish", { state: "failed" })
  }, 180_000)

  it("a caller that never comes: the host end gives up after the join wait; the run's end closes an open session", async () => {
    const run = (await startRun(stack, acct, fn)).id
    const before = await shellsIn(run)
    const { result } = await openTerminal(run)
    await new Promise((r) => setTimeout(r, 4_000))
    expect(await refusalOf(`${result.relay_url}?route=${result.route}&side=caller`)).toBe(404)
    expect(await shellsBackTo(run, before)).toBe(before)

    const open = await openTerminal(run)
    const caller = await connect(open.result.relay_url, open.result.route, open.toHost, open.toCaller)
    caller.send(1, Buffer.from("echo still-here\n"))
    await caller.until("still-here")
    await command(stack, acct, run, "finish", { state: "failed" })
    const ended: Json = await waitRun(stack, acct, run)
    expect(ended.state).toBe("failed")
    expect((await caller.closed).code).toBe(1000)
    // Both sessions' ends are in the log, before the machine's own.
    const log = await logOf(run)
    expect(log.filter((l) => l.kind === "terminal").map((l) => [l.state, l.reason])).toEqual([
      ["opened", undefined],
      ["closed", "no caller joined in time"],
      ["opened", undefined],
      ["closed", "the run ended"],
    ])
  }, 120_000)

  it("a shell that ignores the hangup and never lets its terminal close does not hold the run's end: the machine goes", async () => {
    const run = (await startRun(stack, acct, fn)).id
    const { result, toHost, toCaller } = await openTerminal(run)
    const caller = await connect(result.relay_url, result.route, toHost, toCaller)
    // What a tenant (root in its machine) may do: the shell becomes a program that ignores the
    // hangup a closed terminal sends, and says nothing more; the guest never closes its side.
    caller.send(1, Buffer.from("trap '' HUP TERM; echo holding-$((40+2)); exec sleep infinity\n"))
    await caller.until("holding-42")
    await command(stack, acct, run, "finish", { state: "failed" })
    expect(await caller.closed).toEqual({ code: 1000, reason: "the run ended" })
    // The machine is removed all the same, and the log ends.
    expect(await leftoversOnceGone(run)).toEqual([])
    const log = await logOf(run)
    expect(log.filter((l) => l.kind === "terminal").map((l) => [l.state, l.reason])).toEqual([
      ["opened", undefined],
      ["closed", "the run ended"],
    ])
    expect(log.at(-1)?.kind).toBe("end")
  }, 60_000)

  it("a relay that vanishes says no close: the host end hears nothing for three heartbeats and ends the session", async () => {
    const run = (await startRun(stack, acct, fn)).id
    const before = await shellsIn(run)
    const { result } = await openTerminal(run)
    expect(await shellsIn(run)).toBe(String(Number(before) + 1))
    // A relay's join from a bare connection, which then says nothing, as a relay killed outright.
    const relay = await connectNats({ servers: stack.natsUrl })
    try {
      const out = notesOn(relay, routeSubject(result.route, "out"))
      const answer = await relay.request(routeSubject(result.route, "join"), "", { timeout: 5_000 })
      expect(answer.string()).toBe("ok")
      expect(await shellsBackTo(run, before)).toBe(before)
      // The host end beat three times, heard nothing back, and gave up.
      await out.closed
      expect(out.notes).toEqual(["alive", "alive", "alive", "close 1001 the caller's relay is gone"])
    } finally {
      await relay.close()
    }
    await command(stack, acct, run, "finish", { state: "failed" })
    await waitRun(stack, acct, run)
    const log = await logOf(run)
    expect(log.filter((l) => l.kind === "terminal").map((l) => [l.state, l.reason])).toEqual([
      ["opened", undefined],
      ["closed", "the caller's relay is gone"],
    ])
  }, 60_000)

  it("a host end that vanishes says no close: the relay closes its caller 1011 after three silent heartbeats", async () => {
    // A host end on a bare connection that lets the caller in and then says nothing, as a host
    // agent killed outright.
    const route = randomBytes(16).toString("base64url")
    const host = await connectNats({ servers: stack.natsUrl })
    try {
      const into = notesOn(host, routeSubject(route, "in"))
      host.subscribe(routeSubject(route, "join"), {
        callback: (_e, m) => {
          m.respond("ok")
        },
      })
      await host.flush()
      const caller = await connect(stack.relayUrl, route, randomBytes(32), randomBytes(32))
      expect(await caller.closed).toEqual({ code: 1011, reason: "the host end is gone" })
      // The relay beat three times, then told the host end (in case it only went quiet).
      await into.closed
      expect(into.notes).toEqual(["alive", "alive", "alive", "close 1011 the host end is gone"])
      // Never passed on to the caller: nothing came to it.
      expect(caller.output).toBe("")
    } finally {
      await host.close()
    }
  }, 60_000)

  it("heartbeats keep a quiet session open; the run's timeout closes it 1000 and the run fails timeout", async () => {
    const short = (await publish(stack, acct, { timeout_minutes: 1 })).function
    const run = (await startRun(stack, acct, short)).id
    const { result, toHost, toCaller } = await openTerminal(run)
    const caller = await connect(result.relay_url, result.route, toHost, toCaller)
    caller.send(1, Buffer.from("echo until-timeout\n"))
    await caller.until("until-timeout")
    // Quiet until the run's minute is up, many heartbeats; the session lasts until the timeout.
    expect(await caller.closed).toEqual({ code: 1000, reason: "the run ended" })
    const ended: Json = await waitRun(stack, acct, run)
    expect(ended, JSON.stringify(ended)).toMatchObject({ state: "failed", failure: "timeout" })
    expect(Date.parse(ended.ended_at) - Date.parse(ended.started_at)).toBeGreaterThanOrEqual(MINUTE_MS)
    const log = await logOf(run)
    expect(log.filter((l) => l.kind === "terminal").map((l) => [l.state, l.reason])).toEqual([
      ["opened", undefined],
      ["closed", "the run ended"],
    ])
  }, 60_000)
})
