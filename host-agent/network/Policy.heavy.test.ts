/**
 * The network policy on real machines: two machines from the namespace driver and a stand-in
 * internet namespace (see `testing.ts`), shared by the tests of this file, which run in order.
 */

import { createSocket } from "node:dgram"
import { createServer, type Server } from "node:net"
import { networkInterfaces } from "node:os"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ensureTestBase } from "../bases/Bases.ts"
import { connect, type GuestSession } from "../guest/GuestSession.ts"
import type { Machine } from "../machines/MachineDriver.ts"
import { run } from "../machines/namespace/exec.ts"
import { make, NamespaceDriverSettings } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, newKeys, testDriverSettings, testId } from "../machines/namespace/testing.ts"
import * as Policy from "./Policy.ts"
import * as Internet from "./testing.ts"

const policy = Policy.PolicySettings.defaults
const driver = make(testDriverSettings)
const pool = `${NamespaceDriverSettings.defaults.addressPool.split(".").slice(0, 2).join(".")}.0.0/16`
const keys = newKeys()

let scope: Scope.CloseableScope
let internet: Internet.TestInternet | undefined
let hostServer: Server | undefined
let hostPort = 0
let a: Machine
let b: Machine
let guestA: GuestSession
let guestB: GuestSession

const bash = (g: GuestSession, command: string) =>
  Effect.runPromise(g.bash({ command, timeout_ms: 60_000 })).then((r) => r.output)

// Opens a TCP connection from inside the machine to each target and prints one line per target:
// `<target> OPEN <banner>` or `<target> CLOSED <error>`.
const probeFrom = (g: GuestSession, targets: ReadonlyArray<string>) =>
  bash(
    g,
    `for t in ${targets.join(" ")}; do
      h=\${t%:*}; p=\${t##*:}
      if out=$(timeout 3 bash -c "exec 3<>/dev/tcp/$h/$p && head -c 100 <&3" 2>&1); then echo "$t OPEN $out"
      else echo "$t CLOSED $(echo $out | tr -d '\\n')"; fi
    done`,
  ).then((out) => {
    const byTarget: Record<string, string> = {}
    for (const line of out.trim().split("\n")) {
      const [target, ...rest] = line.split(" ")
      if (target) byTarget[target] = rest.join(" ")
    }
    return byTarget
  })

beforeAll(async () => {
  const base = await ensureTestBase()
  scope = Effect.runSync(Scope.make())
  const create = (label: string) =>
    Effect.runPromise(
      driver.create({
        id: testId(label),
        size: "s",
        base: base.rootfs,
        authorizedKey: keys.client.public,
        hostKey: keys.host.private,
      }),
    )
  // One after the other, so a failure leaves nothing unassigned (afterAll destroys what exists).
  a = await create("neta")
  b = await create("netb")
  const session = (m: Machine) =>
    Effect.runPromise(Scope.extend(connect({ ...m.ssh, privateKey: keys.client.private }), scope))
  ;[guestA, guestB] = await Promise.all([session(a), session(b)])
  internet = await Internet.make(policy, pool)
  hostServer = createServer((s) => s.end("hello host\n"))
  await new Promise<void>((ok) => hostServer?.listen(0, ok))
  const address = hostServer.address()
  hostPort = typeof address === "object" && address ? address.port : 0
}, 15 * 60_000)

afterAll(async () => {
  if (scope) await Effect.runPromise(Scope.close(scope, Exit.void))
  for (const m of [a, b]) if (m) await Effect.runPromise(driver.destroy(m.id))
  await internet?.close()
  await new Promise((ok) => (hostServer ? hostServer.close(ok) : ok(undefined)))
}, 60_000)

describe("network policy", () => {
  it("the stand-in internet's listeners all answer the host (so a refusal below is the policy)", async () => {
    for (const address of Object.values(Internet.addresses)) {
      expect(await Internet.probe(address, 80)).toBe(`hello ${address}:80`)
    }
    expect(await Internet.probe(Internet.addresses.public, 25)).toBe(`hello ${Internet.addresses.public}:25`)
    expect(await Internet.probe("127.0.0.1", hostPort)).toBe("hello host")
  })

  it("a machine reaches the public address and no forbidden range, nor port 25", async () => {
    const pub = `${Internet.addresses.public}:80`
    const forbidden = [
      Internet.addresses.private10,
      Internet.addresses.private172,
      Internet.addresses.private192,
      Internet.addresses.shared100,
      Internet.addresses.metadata,
    ].map((x) => `${x}:80`)
    const smtp = `${Internet.addresses.public}:25`
    const seen = await probeFrom(guestA, [pub, ...forbidden, smtp])
    expect(seen[pub]).toBe(`OPEN hello ${pub}`)
    for (const t of [...forbidden, smtp]) {
      expect(seen[t], t).toMatch(/^CLOSED .*Connection refused/)
    }
  })

  it("a machine reaches neither another machine nor any address of the host", async () => {
    const hostV4 = Object.values(networkInterfaces())
      .flat()
      .filter((i) => i && i.family === "IPv4" && !i.internal)
      .map((i) => i?.address ?? "")
    const hostTargets = [
      String(a.handle.hostAddress), // its own gateway
      String(b.handle.hostAddress),
      internet?.hostAddress ?? "",
      ...hostV4,
    ].map((h) => `${h}:${hostPort}`)
    // The host answers on every one of them itself.
    for (const t of hostTargets) {
      const [h, p] = t.split(":")
      expect(await Internet.probe(h ?? "", Number(p)), t).toBe("hello host")
    }
    const otherMachine = `${b.ssh.host}:22`
    const seen = await probeFrom(guestA, [otherMachine, ...hostTargets])
    for (const t of [otherMachine, ...hostTargets]) expect(seen[t], t).toMatch(/^CLOSED .*Connection refused/)
    // And the other way round.
    const back = await probeFrom(guestB, [`${a.ssh.host}:22`, `${Internet.addresses.public}:80`])
    expect(back[`${a.ssh.host}:22`]).toMatch(/^CLOSED .*Connection refused/)
    expect(back[`${Internet.addresses.public}:80`]).toBe(`OPEN hello ${Internet.addresses.public}:80`)
  })

  it("a machine cannot pass for another: nothing it sends in another's name reaches the host", async () => {
    const port = 7000
    // B answers the host's datagram, then sends one more a moment later (the exchange still open).
    const answering = bash(
      guestB,
      `perl -MIO::Socket::INET -e '
        my $s = IO::Socket::INET->new(Proto => "udp", LocalPort => ${port}) or die "bind: $!";
        $s->recv(my $m, 100); my $peer = $s->peername;
        $s->send("pong", 0, $peer); sleep 2; $s->send("again", 0, $peer); print "answered\\n"'`,
    )
    answering.catch(() => undefined) // awaited below
    const host = createSocket("udp4")
    // A ping sent before B listens comes back as a refusal: not an error of the test.
    host.on("error", () => undefined)
    const heard: Array<string> = []
    let wake: (() => void) | undefined
    host.on("message", (m) => {
      heard.push(m.toString())
      wake?.()
    })
    const until = (n: number) =>
      new Promise<void>((ok) => {
        wake = () => heard.length >= n && ok()
        wake()
      })
    try {
      await new Promise<void>((ok) => host.bind(0, ok))
      await new Promise<void>((ok) => host.connect(port, b.ssh.host, () => ok()))
      // Sent until B's listener is up and answers: the host's exchange with B is established.
      while (heard.length === 0) {
        host.send("ping")
        await Promise.race([until(1), new Promise((r) => setTimeout(r, 200))])
      }
      // A, root in its machine, tries to send into that exchange from B's address and port: over a
      // socket bound to it (the machine may bind any address, for its sshd: `ip_nonlocal_bind`),
      // connected or not, and over a raw socket (it has no `CAP_NET_RAW`).
      const tried = await bash(
        guestA,
        `perl -MIO::Socket::INET -MSocket -e '
          my ($from, $to) = ("${b.ssh.host}", "${b.handle.hostAddress}");
          my $bound = IO::Socket::INET->new(Proto => "udp", LocalAddr => $from, LocalPort => ${port})
            or die "bind: $!";
          print "bound\\n";
          my $dest = sockaddr_in(${host.address().port}, inet_aton($to));
          print(defined(send($bound, "spoofed", 0, $dest)) ? "sent\\n" : "send: $!\\n");
          print(connect($bound, $dest) ? "connected\\n" : "connect: $!\\n");
          print(socket(my $raw, PF_INET, SOCK_RAW, 17) ? "raw\\n" : "raw: $!\\n")'`,
      )
      expect(tried).toBe(
        "bound\nsend: Network is unreachable\nconnect: Network is unreachable\nraw: Operation not permitted\n",
      )
      expect(await answering).toBe("answered\n")
      await until(2)
      expect(heard).toEqual(["pong", "again"])
    } finally {
      host.close()
    }
  })

  it("IPv6 from a machine is dropped, even to the host's link-local address", async () => {
    const shown = await run("ip", [
      "-6",
      "-o",
      "addr",
      "show",
      "dev",
      String(a.handle.hostIf),
      "scope",
      "link",
    ])
    const linkLocal = /inet6 (fe80::[0-9a-f:]+)\//.exec(shown)?.[1]
    expect(linkLocal).toBeDefined()
    // Link-local addresses are usable once duplicate address detection is over, on both ends.
    const hostIf = String(a.handle.hostIf)
    const netns = String(a.handle.netns)
    for (;;) {
      const tentative =
        (await run("ip", ["-6", "addr", "show", "dev", hostIf, "tentative"])) +
        (await run("ip", ["-n", netns, "-6", "addr", "show", "dev", "eth0", "tentative"]))
      if (!tentative.trim()) break
      await new Promise((r) => setTimeout(r, 100))
    }
    // The host answers on it (the server listens on every address, IPv6 too)...
    expect(await Internet.probe(`${linkLocal}%${a.handle.hostIf}`, hostPort)).toBe("hello host")
    // ...but from the machine nothing comes back, not even a refusal.
    const out = await bash(
      guestA,
      `timeout 1 bash -c 'exec 3<>/dev/tcp/${linkLocal}%eth0/${hostPort} && head -c 100 <&3'; echo "status=$?"`,
    )
    expect(out).toContain("status=124")
    expect(out).not.toContain("hello")
  })

  it("new connections beyond the rate are refused", async () => {
    const out = await bash(
      guestA,
      `ok=0; bad=0
      for i in $(seq 400); do
        if : 3<>/dev/tcp/${Internet.addresses.public}/80; then ok=$((ok+1)); else bad=$((bad+1)); fi
      done 2>/tmp/err
      echo "$ok $bad"; sort /tmp/err | uniq -c`,
    )
    const [counts, ...errors] = out.trim().split("\n")
    const [ok, bad] = (counts ?? "").split(" ").map(Number)
    console.log(`rate limit: ${ok} of 400 connections opened at once got through`)
    expect(ok).toBeGreaterThanOrEqual(1)
    expect(ok).toBeLessThan(400)
    expect((ok ?? 0) + (bad ?? 0)).toBe(400)
    expect(errors.join("\n")).toContain("Connection refused")
    // A limit, not a ban: after a pause the machine connects again.
    const later = await bash(guestA, `sleep 0.5; head -c 100 < /dev/tcp/${Internet.addresses.public}/80`)
    expect(later).toBe(`hello ${Internet.addresses.public}:80\n`)
  })

  it("destroy leaves no rule, set element, route or namespace of the machine", async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    for (const m of [a, b]) {
      const hostIf = String(m.handle.hostIf)
      expect(await Policy.traces(policy, hostIf)).not.toEqual([])
      await Effect.runPromise(driver.destroy(m.id))
      expect(await Policy.traces(policy, hostIf)).toEqual([])
      expect(await run("ip", ["route", "show", "table", "all"])).not.toContain(hostIf)
      expect(await run("ip", ["netns", "list"])).not.toContain(String(m.handle.netns))
      expect(await leftovers(m.id)).toEqual([])
    }
    const net = internet
    expect(net).toBeDefined()
    if (!net) return
    expect(await Policy.traces(policy, net.hostIf)).toEqual([`nft element "${net.hostIf}"`])
    await net.close()
    internet = undefined
    expect(await Policy.traces(policy, net.hostIf)).toEqual([])
    expect(await run("ip", ["netns", "list"])).not.toContain(net.netns)
    expect(await run("ip", ["-o", "link", "show"])).not.toContain(net.hostIf)
    expect(await run("ip", ["route", "show", "table", "all"])).not.toContain(net.hostIf)
  })
})
