// A machine is a security boundary: each case here is what a hostile tenant would try, typed as
// plain commands into a real namespace machine (root inside it, over its real SSH), and checked
// from the host where the host is what could be harmed.
import { readFile, stat, statfs } from "node:fs/promises"
import { request } from "node:http"
import { join } from "node:path"
import { Effect, Exit } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ensureTestBase } from "../../bases/Bases.ts"
import type { BashArgs } from "../../guest/GuestSession.ts"
import { type TestGuest, testGuest } from "../../guest/testing.ts"
import * as Cgroups from "./Cgroups.ts"
import { run } from "./exec.ts"
import { make, NamespaceDriverSettings } from "./NamespaceDriver.ts"
import { capabilities } from "./Oci.ts"
import { leftovers, newKeys, testId } from "./testing.ts"

const settings = NamespaceDriverSettings.defaults
const GiB = 1024 ** 3
let a: TestGuest
let b: TestGuest

beforeAll(async () => {
  a = await testGuest("isoa", { diskBytes: GiB, memoryBytes: 2 * GiB })
  b = await testGuest("isob")
}, 15 * 60_000)

afterAll(async () => {
  const left = [...((await a?.close()) ?? []), ...((await b?.close()) ?? [])]
  expect(left).toEqual([])
})

const sh = (g: TestGuest, command: string, extra: Partial<BashArgs> = {}) =>
  Effect.runPromise(g.guest.bash({ command, timeout_ms: 120_000, ...extra }))

/** Runs each command in the machine and answers its exit status. */
const statuses = async (g: TestGuest, commands: ReadonlyArray<string>) => {
  const out = await sh(g, commands.map((c) => `${c} >/dev/null 2>&1; echo "$?"`).join("\n"))
  const codes = out.output.trim().split("\n").map(Number)
  return Object.fromEntries(commands.map((c, i) => [c, codes[i]]))
}

const hostPid = (g: TestGuest) => Number(g.machine.handle.pid)
const hostIdOfMachine = (g: TestGuest) => Number(g.machine.handle.hostId)
const capBit = (name: string) =>
  ({
    CAP_NET_ADMIN: 12,
    CAP_NET_RAW: 13,
    CAP_SYS_MODULE: 16,
    CAP_SYS_RAWIO: 17,
    CAP_SYS_PTRACE: 19,
    CAP_SYS_ADMIN: 21,
    CAP_SYS_BOOT: 22,
    CAP_SYS_RESOURCE: 24,
    CAP_SYS_TIME: 25,
    CAP_MKNOD: 27,
    CAP_SYSLOG: 34,
    CAP_BPF: 39,
  })[name] ?? -1
const hasCap = (hex: string, bit: number) => (BigInt(`0x${hex}`) >> BigInt(bit)) & 1n

describe("root in a machine is an unprivileged tenant of the host", () => {
  it("is a uid of its own range on the host, without the host's dangerous capabilities, under seccomp", async () => {
    const status = await readFile(`/proc/${hostPid(a)}/status`, "utf8")
    const field = (name: string) => new RegExp(`^${name}:\\s*(.*)$`, "m").exec(status)?.[1] ?? ""
    // The host sees the machine's root as the first id of its range, never as root.
    const uid = Number(field("Uid").split(/\s+/)[0])
    expect(uid).toBe(hostIdOfMachine(a))
    expect(uid).toBeGreaterThanOrEqual(settings.idBase)
    expect(hostIdOfMachine(a)).not.toBe(hostIdOfMachine(b))
    expect((await readFile(`/proc/${hostPid(a)}/uid_map`, "utf8")).trim().split(/\s+/)).toEqual([
      "0",
      String(uid),
      "65536",
    ])
    for (const name of [
      "CAP_SYS_ADMIN",
      "CAP_SYS_MODULE",
      "CAP_MKNOD",
      "CAP_SYS_RAWIO",
      "CAP_NET_ADMIN",
      "CAP_NET_RAW",
      "CAP_SYS_PTRACE",
      "CAP_SYS_BOOT",
      "CAP_SYS_TIME",
      "CAP_SYSLOG",
      "CAP_BPF",
    ]) {
      expect(hasCap(field("CapEff"), capBit(name)), name).toBe(0n)
      expect(hasCap(field("CapBnd"), capBit(name)), name).toBe(0n)
    }
    expect(field("Seccomp")).toBe("2")
    expect(field("NoNewPrivs")).toBe("1")

    // Inside, a command sees the same reduced set (and is root there).
    const inside = await sh(a, "id -u; grep -E '^(CapEff|CapBnd|Seccomp):' /proc/self/status")
    const [id, capEff, capBnd, seccomp] = inside.output.trim().split("\n")
    expect(id).toBe("0")
    expect(capEff).not.toContain("000001ffffffffff")
    expect(capEff?.split(/\s+/)[1]).toBe(capBnd?.split(/\s+/)[1])
    expect(hasCap(capEff?.split(/\s+/)[1] ?? "0", capBit("CAP_SYS_ADMIN"))).toBe(0n)
    expect(seccomp).toMatch(/Seccomp:\s+2/)
    expect(capabilities).not.toContain("CAP_SYS_ADMIN")
  })

  it("cannot mount, make devices or namespaces, or change its network", async () => {
    const codes = await statuses(a, [
      "mount -t tmpfs none /mnt",
      "mount --bind /proc /mnt",
      "mount -t proc proc /mnt",
      "mount -t cgroup -o memory none /mnt",
      "mknod /tmp/sda b 8 0",
      "mknod /tmp/mem c 1 1",
      "unshare --mount true",
      "unshare --user true",
      "unshare --net true",
      "unshare --pid --fork true",
      "nsenter --target 1 --mount true",
      "ip addr add 10.9.9.9/24 dev eth0",
      "ip link set eth0 down",
      "hostname other",
      "chroot / true",
    ])
    for (const [command, code] of Object.entries(codes)) {
      if (command === "chroot / true")
        expect(code, command).toBe(0) // sshd needs it; harmless in its own root
      else expect(code, command).not.toBe(0)
    }
    // Only the usual device nodes exist.
    const devices = (
      await sh(
        a,
        'for f in /dev/* /dev/*/*; do if [ ! -L "$f" ] && { [ -c "$f" ] || [ -b "$f" ]; }; then echo "$f"; fi; done',
      )
    ).output
      .trim()
      .split("\n")
    expect(devices.filter((d) => !d.startsWith("/dev/pts/"))).toEqual([
      "/dev/full",
      "/dev/null",
      "/dev/random",
      "/dev/tty",
      "/dev/urandom",
      "/dev/zero",
    ])
  })

  it("cannot write kernel settings, read the kernel log or kernel addresses", async () => {
    // Each write, were it let through, would change nothing on the host: the values written are
    // the host's own (or harmless), so a regression fails the test without harming the CI host.
    const corePattern = await readFile("/proc/sys/kernel/core_pattern", "utf8")
    // (Some kernels have no magic SysRq at all; its files are then missing on the host too.)
    const sysrq = (await readFile("/proc/sys/kernel/sysrq", "utf8").catch(() => "0")).trim()
    const pidMax = (await readFile("/proc/sys/kernel/pid_max", "utf8")).trim()
    const codes = await statuses(a, [
      `printf '%s' '${corePattern.trim().replace(/'/g, "")}' > /proc/sys/kernel/core_pattern`,
      "echo 1 > /proc/sys/vm/drop_caches",
      `echo ${sysrq} > /proc/sys/kernel/sysrq`,
      "echo h > /proc/sysrq-trigger",
      `sysctl -w kernel.pid_max=${pidMax}`,
      "echo /tmp/pwn > /sys/fs/cgroup/memory/release_agent",
      "echo 1 > /sys/fs/cgroup/memory/notify_on_release && test -e /sys/fs/cgroup/memory/release_agent",
      "dmesg",
      "head -c 1 /proc/kcore | grep -q .",
      "grep -qv '^0000000000000000 ' /proc/kallsyms",
    ])
    for (const [command, code] of Object.entries(codes)) expect(code, command).not.toBe(0)
    expect(await readFile("/proc/sys/kernel/core_pattern", "utf8")).toBe(corePattern)
  })

  it("sees only its own cgroups and cannot leave them", async () => {
    const out = await sh(
      a,
      [
        "cat /proc/self/cgroup",
        "echo ---",
        "ls /sys/fs/cgroup",
        "echo ---",
        // Every way out that a tenant could think of; none may move it anywhere the host sees.
        "for f in /sys/fs/cgroup/memory/cgroup.procs /sys/fs/cgroup/memory/../cgroup.procs /sys/fs/cgroup/memory/../../cgroup.procs; do { echo $$ > $f; } 2>/dev/null; done",
        "grep -rl hangar /proc/self/cgroup /proc/self/mountinfo /sys/fs/cgroup 2>/dev/null | head -3",
        "echo ---",
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
      ].join("\n"),
    )
    const [own, visible, leaks, limit] = out.output.split("---\n")
    for (const line of own?.trim().split("\n") ?? []) expect(line, line).toMatch(/^\d+:[^:]*:\/[^:]*$/)
    expect(own).not.toContain("hangar")
    expect(visible?.trim()).toBe("memory")
    expect(leaks?.trim()).toBe("")
    // The machine's own limit is above what it can see; what it sees is no higher than the size.
    expect(Number(limit?.trim())).toBeGreaterThanOrEqual(2 * GiB)
    // From the host: every process of the machine is still inside the machine's groups.
    const id = a.machine.id
    for (const pid of await Cgroups.tasks(settings.cgroupRoot, id)) {
      const groups = await readFile(`/proc/${pid}/cgroup`, "utf8").catch(() => "")
      for (const line of groups.trim().split("\n")) {
        if (/^\d+:(memory|cpu|pids|blkio):/.test(line) || /^\d+:cpu,cpuacct:/.test(line))
          expect(line, `pid ${pid}`).toContain(`/hangar/${id}`)
      }
    }
    expect(
      await readFile(
        join(Cgroups.groupOf(settings.cgroupRoot, "memory", id), "memory.limit_in_bytes"),
        "utf8",
      ),
    ).toBe(`${2 * GiB}\n`)
  })

  it("cannot see or reach another machine", async () => {
    const other = b.machine.id
    // The id to look for comes from a file, so no command line of the search holds it (the
    // command's own environment, which does, is not searched).
    const out = await sh(
      a,
      `printf %s "$OTHER" > /tmp/other; unset OTHER; ps -e -o pid= | wc -l; grep -rslF -f /tmp/other /proc/[0-9]*/cgroup /proc/[0-9]*/cmdline /proc/self/mountinfo /sys/fs/cgroup 2>/dev/null | head -3; ls /sys/class/net`,
      { env: { OTHER: other } },
    )
    const [count, ...rest] = out.output.trim().split("\n")
    expect(Number(count)).toBeLessThan(20) // its own sshd, session and this command only
    expect(rest).toEqual(["eth0", "lo"])
    // And the network policy refuses a connection to it.
    const tcp = await sh(a, `timeout 5 bash -c 'echo > /dev/tcp/${b.machine.ssh.host}/22' 2>&1; echo "rc=$?"`)
    expect(tcp.output).not.toMatch(/rc=0/)
  })

  it("pings with ICMP datagram sockets, but may not open raw ones", async () => {
    const out = await sh(
      a,
      `python3 -c '
import socket
socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); print("icmp datagram: ok")
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw: opened")
except PermissionError:
    print("raw: refused")'`,
    )
    expect(out.output).toBe("icmp datagram: ok\nraw: refused\n")
  })

  it("its mount table names no host folder", async () => {
    const mounts = (await sh(a, "cat /proc/self/mountinfo")).output
    const base = (await ensureTestBase()).rootfs
    for (const hostPath of [
      settings.machinesDir,
      base,
      "/var/lib",
      "/var/cache",
      settings.runDir,
      a.machine.id,
    ])
      expect(mounts, hostPath).not.toContain(hostPath)
  })

  it("every byte it writes counts against its disk: 3 GiB outside /workspace fails with ENOSPC", async () => {
    const out = await sh(
      a,
      "head -c 3G /dev/zero > /var/tmp/big; echo rc=$?; df -B1 --output=size / | tail -1; rm -f /var/tmp/big",
    )
    expect(out.output).toContain("No space left on device")
    expect(out.output).toContain("rc=1")
    expect(Number(out.output.trim().split("\n").at(-1))).toBeLessThanOrEqual(GiB)
    // On the host the machine's image never took more than its size.
    const image = await stat(join(settings.machinesDir, a.machine.id, "disk.img"))
    expect(image.blocks * 512).toBeLessThanOrEqual(GiB)
  })

  it("disk bandwidth and operations per second are held to the size's (1 vCPU: 50 MB/s, 5,000/s)", async () => {
    // dd reports its own rate; the throttle is an upper bound, so a slow host only lowers it.
    const rateOf = (text: string) => {
      const m = /(\d+) bytes .* copied, ([\d.]+) s/.exec(text)
      if (!m) throw new Error(`no dd figure in: ${text}`)
      return Number(m[1]) / Number(m[2])
    }
    const bytes = await sh(
      a,
      "dd if=/dev/zero of=/workspace/io bs=1M count=100 oflag=direct 2>&1; rm -f /workspace/io",
    )
    expect(rateOf(bytes.output)).toBeLessThanOrEqual(50_000_000 * 1.1)
    const ops = await sh(
      a,
      "dd if=/dev/zero of=/workspace/io bs=4k count=12000 oflag=direct 2>&1; rm -f /workspace/io",
    )
    expect(rateOf(ops.output) / 4096).toBeLessThanOrEqual(5_000 * 1.1)
  })

  it("network bandwidth is shaped to the size's 25 MB/s each way", async () => {
    const bits = `${(25_000_000 * 8) / 1_000_000}Mbit`
    const host = await run("tc", ["qdisc", "show", "dev", String(a.machine.handle.hostIf)])
    expect(host).toContain(`tbf`)
    expect(host).toContain(`rate ${bits}`)
    const guest = await run("tc", ["-n", String(a.machine.handle.netns), "qdisc", "show", "dev", "eth0"])
    expect(guest).toContain(`rate ${bits}`)
    // 40 MB from the machine to the host (a connection the host opens) takes at least 40/25 s.
    // The machine serves one request; the host retries until it is listening.
    const serving = sh(
      a,
      `head -c 40000000 /dev/zero > /workspace/blob && cd /workspace && timeout 60 python3 -c '
import http.server as h
h.HTTPServer(("0.0.0.0", 8000), h.SimpleHTTPRequestHandler).handle_request()'`,
    )
    const get = () =>
      new Promise<{ n: number; ms: number }>((ok, fail) => {
        const started = performance.now()
        request({ host: a.machine.ssh.host, port: 8000, path: "/blob" }, (res) => {
          let n = 0
          res.on("data", (c: Buffer) => {
            n += c.length
          })
          res.on("end", () => ok({ n, ms: performance.now() - started }))
          res.on("error", fail)
        })
          .on("error", fail)
          .end()
      })
    let got: { n: number; ms: number } | undefined
    for (let i = 0; i < 400 && got === undefined; i++) {
      got = await get().catch(async () => {
        await new Promise((r) => setTimeout(r, 50))
        return undefined
      })
    }
    expect((await serving).exit_code).toBe(0)
    const received = got?.n ?? 0
    const seconds = (got?.ms ?? 0) / 1000
    expect(received).toBe(40_000_000)
    expect(received / seconds).toBeLessThanOrEqual(25_000_000 * 1.15)
  })

  it("nproc and free show the size, not the host", async () => {
    const out = await sh(a, "nproc; free -b | awk '/^Mem:/ {print $2}'; grep -c ^processor /proc/cpuinfo")
    const [nproc, memory, cpuinfo] = out.output.trim().split("\n").map(Number)
    expect(nproc).toBe(1)
    expect(memory).toBe(2 * GiB)
    expect(cpuinfo).toBe(1)
  })
})

describe("a machine's limits protect the host", () => {
  it("a fork loop stops at the machine's pids.max and the host keeps forking", async () => {
    const g = await testGuest("forks", {}, { pidsMax: 100 })
    try {
      const out = await sh(
        g,
        `python3 -c '
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60); os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
'`,
      )
      const [forked, errno] = out.output.trim().split(" ").map(Number)
      expect(errno).toBe(11) // EAGAIN
      expect(forked).toBeLessThan(100)
      expect(forked).toBeGreaterThan(50)
      expect(
        (
          await readFile(join(Cgroups.groupOf(settings.cgroupRoot, "pids", g.machine.id), "pids.max"), "utf8")
        ).trim(),
      ).toBe("100")
      // The host is untouched: it starts processes as before.
      expect((await run("sh", ["-c", "echo forked"])).trim()).toBe("forked")
    } finally {
      expect(await g.close()).toEqual([])
    }
  })

  it("machines together cannot take half the host's process ids", async () => {
    const pidMax = Number((await readFile("/proc/sys/kernel/pid_max", "utf8")).trim())
    const threadsMax = Number((await readFile("/proc/sys/kernel/threads-max", "utf8")).trim())
    const pids = Number(
      (
        await readFile(join(Cgroups.groupOf(settings.cgroupRoot, "pids", a.machine.id), "pids.max"), "utf8")
      ).trim(),
    )
    expect(pids * settings.maxMachines).toBeLessThanOrEqual(Math.min(pidMax, threadsMax) / 2)
    expect(pidMax).toBe(4_194_304)
  })

  it("a machine whose full disk the host cannot hold, with the others' at full size, is refused, leaving nothing", async () => {
    const base = await ensureTestBase()
    const keys = newKeys()
    const free = async () => {
      const fs = await statfs(settings.machinesDir)
      return fs.bavail * fs.bsize
    }
    const create = (id: string, diskBytes: number) =>
      Effect.runPromiseExit(
        // The deployed defaults: every sparse image counts at its full size.
        make(settings).create({
          id,
          size: "s",
          base: base.rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
          override: { diskBytes },
        }),
      )
    // More than the free space alone: refused.
    const huge = testId("huge")
    const refused = await create(huge, (await free()) + 64 * GiB)
    expect(Exit.isFailure(refused)).toBe(true)
    expect(String(refused)).toContain("disk room")
    expect(await leftovers(huge)).toEqual([])
    // A machine holding 60% of the free space (sparse: it takes almost nothing yet) leaves no
    // room for another 60% one, though the disk is still nearly empty.
    const big = await testGuest("big", { diskBytes: Math.floor((await free()) * 0.6) })
    try {
      const second = testId("second")
      const tooMuch = await create(second, Math.floor((await free()) * 0.6))
      expect(Exit.isFailure(tooMuch)).toBe(true)
      expect(String(tooMuch)).toContain("disk room")
      expect(await leftovers(second)).toEqual([])
      // The same machine is admitted where the host may promise its disk 16 times over (as the
      // tests' hosts do: machines of other test files running beside this one count in full above).
      const third = testId("third")
      const overcommitted = make({ ...settings, diskOvercommit: 16 })
      const fits = await Effect.runPromiseExit(
        overcommitted.create({
          id: third,
          size: "s",
          base: base.rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
          override: { diskBytes: Math.floor((await free()) * 0.6) },
        }),
      )
      try {
        expect(Exit.isSuccess(fits)).toBe(true)
      } finally {
        await Effect.runPromise(overcommitted.destroy(third))
      }
      expect(await leftovers(third)).toEqual([])
    } finally {
      expect(await big.close()).toEqual([])
    }
  })
})
