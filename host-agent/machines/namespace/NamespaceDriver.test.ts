import { spawnSync } from "node:child_process"
import { readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from "node:fs"
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { type AddressInfo, createConnection, createServer, type Server } from "node:net"
import { tmpdir } from "node:os"
import { basename, join } from "node:path"
import { fileURLToPath } from "node:url"
import { Cause, Effect, Exit, Option } from "effect"
import { beforeAll, describe, expect, it } from "vitest"
import { type Base, ensureTestBase } from "../../bases/Bases.ts"
import { connect } from "../../guest/GuestSession.ts"
import * as Policy from "../../network/Policy.ts"
import { mountsOf, normalNice, readText } from "../HostFiles.ts"
import {
  BACKGROUND_WEIGHT,
  backgroundNice,
  type Machine,
  type MachineSpec,
  NORMAL_WEIGHT,
  scopedOn,
} from "../MachineDriver.ts"
import * as Cgroups from "./Cgroups.ts"
import { run } from "./exec.ts"
import {
  cpusOf,
  endMachineThread,
  listening,
  loopsOf,
  machineThreadPriority,
  make,
} from "./NamespaceDriver.ts"
import * as Net from "./Net.ts"
import { leftovers, newKeys, testDriverSettings, testId } from "./testing.ts"

const driver = make(testDriverSettings)

const keys = newKeys()
let base: Base

beforeAll(async () => {
  base = await ensureTestBase()
}, 15 * 60_000)

const spec = (label: string, extra: Partial<MachineSpec> = {}): MachineSpec => ({
  id: testId(label),
  size: "s",
  base: base.rootfs,
  authorizedKey: keys.client.public,
  hostKey: keys.host.private,
  ...extra,
})

// Runs `f` with a session to a fresh machine, then destroys the machine.
const withMachine = <A>(
  s: MachineSpec,
  f: (m: { bash: (c: string) => Promise<{ exit_code: number; output: string }> }) => Promise<A>,
) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const machine = yield* scopedOn(driver, s)
        const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
        return yield* Effect.promise(() =>
          f({ bash: (command) => Effect.runPromise(guest.bash({ command })) }),
        )
      }),
    ),
  )

/** Runs `command` on `machine` over a session of its own. */
const bashOn = (machine: Machine, command: string) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.flatMap(connect({ ...machine.ssh, privateKey: keys.client.private }), (g) =>
        g.bash({ command }),
      ),
    ),
  )

/** The cgroup2 mounts of this process's view. */
const cgroup2Mounts = () =>
  mountsOf(readFileSync("/proc/self/mountinfo", "utf8")).filter((m) => m.type === "cgroup2")

describe("the host's cgroups favor dynamic changes", () => {
  it("remounts each writable cgroup2 mount without favordynmods, keeping its superblock options, and no other", () => {
    const info = [
      "25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - tmpfs tmpfs rw,mode=755",
      "26 25 0:23 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,memory",
      "41 25 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
      "42 1 0:39 / /srv/cg\\040two rw shared:11 master:2 - cgroup2 none rw,nsdelegate,memory_recursiveprot",
      "43 1 0:40 / /srv/favoring rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods",
      "44 1 0:41 / /srv/read-only ro,relatime - cgroup2 cgroup2 rw",
      "45 1 0:42 / /srv/read-only-super rw,relatime - cgroup2 cgroup2 ro,nsdelegate",
      "",
    ].join("\n")
    expect(Cgroups.toFavorDynmods(info)).toEqual([
      { mountPoint: "/sys/fs/cgroup/unified", options: "remount,favordynmods" },
      { mountPoint: "/srv/cg two", options: "remount,nsdelegate,memory_recursiveprot,favordynmods" },
    ])
    expect(Cgroups.toFavorDynmods("")).toEqual([])
  })

  it("turns it on again for a machine's start when a mount of cgroup2 without it (as lxcfs makes at its start) turned it off", async () => {
    // What lxcfs does at each start, in its own mount namespace: the kernel applies a new mount's
    // options, favordynmods absent, to the whole host.
    const dir = await mkdtemp(join(tmpdir(), "hangar-cgroup2-"))
    try {
      const off = spawnSync(
        "unshare",
        [
          "-m",
          "sh",
          "-c",
          // Read by the shell itself, no program started between the mount and the read: another
          // file's machine start may turn it on again at any time.
          `mount --make-rprivate / && mount -t cgroup2 none ${dir} && while IFS= read -r l; do printf '%s\\n' "$l"; done < /proc/self/mountinfo`,
        ],
        { encoding: "utf8" },
      )
      expect(off.status, off.stderr).toBe(0)
      const mounted = mountsOf(off.stdout).find((m) => m.point === dir)
      expect(mounted?.superOptions).not.toContain("favordynmods")
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
    const before = cgroup2Mounts()
    await withMachine(spec("favor"), async (m) => {
      expect((await m.bash("true")).exit_code).toBe(0)
    })
    const after = cgroup2Mounts()
    const seen = JSON.stringify({ before, after })
    // A host without cgroup2 has nothing to turn on; this one has its hybrid layout's `unified`.
    expect(after.length, seen).toBeGreaterThan(0)
    expect(
      after.map((m) => m.point),
      seen,
    ).toEqual(before.map((m) => m.point))
    for (const [i, m] of after.entries()) {
      expect(m.superOptions, seen).toContain("favordynmods")
      expect(m.options, seen).toEqual(before[i]?.options)
      for (const o of before[i]?.superOptions ?? [])
        expect(m.superOptions.includes(o), `${m.point}: ${o}`).toBe(true)
    }
  })

  it("looks at each start, remounts only when it is off, and tries no more once the kernel refuses", async () => {
    const dir = await mkdtemp(join(tmpdir(), "hangar-cgroup2-"))
    try {
      const mountinfo = join(dir, "mountinfo")
      const tried: Array<ReadonlyArray<string>> = []
      const counted = (args: ReadonlyArray<string>) => {
        tried.push(args)
        return run("mount", args)
      }
      const line = (point: string, superOptions: string) =>
        `40 30 0:37 / ${point} rw,relatime - cgroup2 cgroup2 ${superOptions}\n`

      // On: nothing to do, however often asked.
      await writeFile(mountinfo, line("/sys/fs/cgroup/unified", "rw,favordynmods"))
      const favor = Cgroups.favorer(mountinfo, counted)
      await Promise.all([favor(), favor()])
      expect(tried).toEqual([])

      // A folder that is no mount: mount fails once, and is not run again.
      const notMounted = join(dir, "not-mounted")
      await mkdir(notMounted)
      await writeFile(mountinfo, line(notMounted, "rw,nsdelegate"))
      await Promise.all([favor(), favor()])
      await favor()
      expect(tried).toEqual([["-o", "remount,nsdelegate,favordynmods", notMounted]])

      // A remount that succeeds and leaves it off (as from outside the host's cgroup namespace):
      // the host's own mount, whose setting this file does not show, taken once and no more.
      const other = Cgroups.favorer(mountinfo, counted)
      tried.length = 0
      await writeFile(mountinfo, line("/sys/fs/cgroup/unified", "rw"))
      await other()
      await other()
      expect(tried).toEqual([["-o", "remount,favordynmods", "/sys/fs/cgroup/unified"]])
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })
})

describe("cores of a machine", () => {
  it("pins a machine smaller than the host to the least used cores, and a large one to none", () => {
    expect(cpusOf(1, [], 2)).toBe("0")
    expect(cpusOf(1, ["0"], 2)).toBe("1")
    expect(cpusOf(1, ["0", "1"], 2)).toBe("0")
    expect(cpusOf(1, ["0", "0-1"], 2)).toBe("1")
    expect(cpusOf(2, ["0-3", "1", "2"], 4)).toBe("0,3")
    expect(cpusOf(3, ["1-2"], 4)).toBe("0,1,3")
    expect(cpusOf(2, [], 2)).toBeUndefined()
    expect(cpusOf(8, ["0"], 4)).toBeUndefined()
  })
})

describe("a machine's sshd seen listening", () => {
  it("is a listening socket on the address and port in the process's network namespace, found with no connection", async () => {
    const opened: Array<Server> = []
    const listen = (host: string) =>
      new Promise<number>((ok, fail) => {
        const server = createServer()
        opened.push(server)
        server.once("error", fail)
        server.listen(0, host, () => ok((server.address() as AddressInfo).port))
      })
    try {
      const port = await listen("127.0.0.1")
      expect(listening(process.pid, "127.0.0.1", port)).toBe(true)
      expect(listening(process.pid, "127.0.0.2", port)).toBe(false)
      // A port with a connection to it but no listener is not listening.
      const client = createConnection(port, "127.0.0.1")
      await new Promise((ok) => client.once("connect", ok))
      opened[0]?.close() // stops listening at once; its accepted connection goes on
      await new Promise((ok) => setImmediate(ok))
      expect(listening(process.pid, "127.0.0.1", port)).toBe(false)
      client.destroy()
      // Bound to every address: listening on each.
      const any = await listen("0.0.0.0")
      expect(listening(process.pid, "127.0.0.3", any)).toBe(true)
      // A process that is gone listens on nothing.
      expect(listening(2 ** 22 + 1, "127.0.0.1", any)).toBe(false)
    } finally {
      for (const server of opened) server.close()
    }
  })
})

describe("namespace driver", () => {
  it("creates a machine reachable over SSH with its limits, and destroy leaves nothing", async () => {
    const s = spec("basic")
    const machine = await Effect.runPromise(driver.create(s))
    // A failed check below still removes the machine (the destroy at the end is checked itself).
    try {
      expect(machine.ssh.port).toBe(22)
      expect(machine.limits).toEqual({ vcpus: 1, memoryBytes: 2 * 1024 ** 3, diskBytes: 16 * 1024 ** 3 })
      // Its first program holds its stdio and its listening socket, nothing of crun's start (crun ran
      // from the tool runner's sealed copy, handed to it on descriptor 3).
      const pid = (machine.handle as { readonly pid: number }).pid
      const held = readdirSync(`/proc/${pid}/fd`).map(
        (fd) => [Number(fd), readlinkSync(`/proc/${pid}/fd/${fd}`)] as const,
      )
      expect(held.filter(([fd]) => fd <= 2).map(([, to]) => basename(to))).toEqual([
        "null",
        "machine.log",
        "machine.log",
      ])
      expect(held.filter(([fd, to]) => fd > 2 && !to.startsWith("socket:"))).toEqual([])
      // Its first two commands' groups are made with it, all theirs the machine root's, as if it had
      // made them (the first command's wrapper starts no mkdir, and can move itself in).
      const hostId = (machine.handle as { readonly hostId: number }).hostId
      for (const k of [0, 1]) {
        const group = join(Cgroups.guestGroupOf(testDriverSettings.cgroupRoot, s.id), `p${k}`)
        const files = [group, ...readdirSync(group).map((f) => join(group, f))]
        expect(files.length).toBeGreaterThan(10)
        expect(new Set(files.map((f) => statSync(f).uid))).toEqual(new Set([hostId]))
      }
      const out = await bashOn(
        machine,
        "echo hello; hostname; df -B1 --output=size /workspace | tail -1; cat /proc/1/cmdline | tr '\\0' ' '; echo; id -u; ls -A /workspace; ls -A /workspace/in | wc -l; ls -A /workspace/out | wc -l",
      )
      const lines = out.output.split("\n")
      expect(lines[0]).toBe("hello")
      expect(lines[1]).toBe("machine")
      // ext4 keeps a little for itself; the disk is the size's 16 GiB.
      expect(Number(lines[2])).toBeGreaterThan(15.5 * 1024 ** 3)
      expect(Number(lines[2])).toBeLessThanOrEqual(16 * 1024 ** 3)
      expect(lines[3]).toContain("sshd") // pid 1 of its own pid namespace
      expect(lines[4]).toBe("0") // root
      // An empty input and output folder, whatever the run will do.
      expect(lines.slice(5, 9)).toEqual(["in", "out", "0", "0"])
      expect(await leftovers(s.id)).not.toEqual([])
    } finally {
      await Effect.runPromise(driver.destroy(s.id))
    }
    expect(await leftovers(s.id)).toEqual([])
    // Idempotent: destroying again (and destroying a machine that never existed) succeeds.
    await Effect.runPromise(driver.destroy(s.id))
    await Effect.runPromise(driver.destroy(testId("never")))
  })

  it("its mounts never reach the host, even from a machines folder whose mounts propagate (as systemd makes /)", async () => {
    // A machines folder on a shared mount: a mount made below it in a namespace that kept the
    // sharing would show in the host's namespace too.
    const folder = await mkdtemp(join(tmpdir(), "hg-shared-"))
    const mount = (...args: Array<string>) => {
      const done = spawnSync("mount", args, { encoding: "utf8" })
      if (done.status !== 0) throw new Error(`mount ${args.join(" ")}: ${done.stderr}`)
    }
    try {
      await chmod(folder, 0o755)
      mount("--bind", folder, folder)
      mount("--make-shared", folder)
      const places = { ...testDriverSettings, machinesDir: folder }
      const shared = make(places)
      const s = spec("shared")
      const machine = await Effect.runPromise(shared.create(s))
      const { pid } = machine.handle as { readonly pid: number }
      const below = (view: string) =>
        readFileSync(view, "utf8")
          .split("\n")
          .filter((line) => line.includes(`${folder}/`))
      // Looked at, then the machine removed whatever was seen (a mount that reached the host makes
      // its removal fail too: that failure must not hide what was seen).
      let views: { readonly machine: string; readonly host: Array<string>; readonly init: Array<string> }
      let destroyed: Exit.Exit<void, unknown>
      try {
        views = {
          machine: readFileSync(`/proc/${pid}/mountinfo`, "utf8"),
          host: below("/proc/self/mountinfo"),
          init: below("/proc/1/mountinfo"),
        }
      } finally {
        destroyed = await Effect.runPromiseExit(shared.destroy(s.id))
      }
      expect(views.machine).toContain("upperdir=disk/upper")
      expect(views.host).toEqual([])
      expect(views.init).toEqual([])
      expect(Exit.isSuccess(destroyed), String(destroyed)).toBe(true)
      expect(await leftovers(s.id, places)).toEqual([])
    } finally {
      spawnSync("umount", ["--recursive", "--lazy", folder])
      await rm(folder, { recursive: true, force: true })
    }
  })

  it("removes a claim no machine took over without a network tool: it holds no network slot", async () => {
    const id = testId("claimonly")
    const table = Policy.PolicySettings.defaults.table
    // A link and a netns of the id's names, made by hand: a network tool run for the id removes them.
    await run("ip", ["link", "add", Net.hostIfOf(id), "type", "veth", "peer", "name", `z${Net.hostIfOf(id)}`])
    await run("ip", ["netns", "add", Net.netnsOf(id)])
    try {
      await Effect.runPromise(driver.claim(id, "host-claim", "a run's claim"))
      expect(Net.leased(testDriverSettings.runDir, id)).toBe(false)
      await Effect.runPromise(driver.destroy(id))
      const left = await leftovers(id)
      expect(left).toEqual([`veth ${Net.hostIfOf(id)}`, `netns ${Net.netnsOf(id)}`])
      expect(await run("nft", ["list", "table", "inet", table])).not.toContain(
        Policy.chainOf(Net.hostIfOf(id)),
      )
    } finally {
      await run("ip", ["link", "del", Net.hostIfOf(id)]).catch(() => undefined)
      await run("ip", ["netns", "del", Net.netnsOf(id)]).catch(() => undefined)
    }
    expect(await leftovers(id)).toEqual([])
  })

  it("a destroy whose network rules would not go keeps the slot, and a destroy asked again removes them and gives it back", async () => {
    const s = spec("stuckrules")
    const table = Policy.PolicySettings.defaults.table
    const chain = Policy.chainOf(Net.hostIfOf(s.id))
    // A rule of another chain jumping to the machine's: nft refuses to delete a chain in use.
    const blocker = `zz_${s.id.slice(-8)}`
    try {
      await Effect.runPromise(driver.create(s))
      await run("nft", ["add", "chain", "inet", table, blocker])
      await run("nft", ["add", "rule", "inet", table, blocker, "jump", chain])
      const exit = await Effect.runPromiseExit(driver.destroy(s.id))
      const error = Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()
      expect(Option.getOrThrow(error)).toMatchObject({
        _tag: "MachineDestroyFailed",
        detail: expect.stringContaining("network policy"),
      })
      // Its processes, disk and links are gone; its rules and its slot are not.
      expect(await leftovers(s.id)).toEqual([
        "network lease",
        `nft chain ${chain}`,
        `nft element "${Net.hostIfOf(s.id)}"`,
      ])
      await run("nft", ["delete", "chain", "inet", table, blocker])
      await Effect.runPromise(driver.destroy(s.id))
      expect(await leftovers(s.id)).toEqual([])
    } finally {
      await run("nft", ["delete", "chain", "inet", table, blocker]).catch(() => undefined)
      await Effect.runPromise(driver.destroy(s.id))
    }
  })

  it("a kept machine is adopted while it runs, with its note; not once its process died, nor one never kept", async () => {
    const s = spec("keep", { owner: "host-keep" })
    const never = spec("unkept", { owner: "host-keep" })
    try {
      const machine = await Effect.runPromise(driver.create(s))
      await Effect.runPromise(driver.create(never))
      expect([...(await Effect.runPromise(driver.owned("host-keep")))].sort()).toEqual(
        [s.id, never.id].sort(),
      )
      expect(Option.isNone(await Effect.runPromise(driver.adopt(s.id)))).toBe(true)
      await Effect.runPromise(driver.keep(machine, "the caller's note"))
      const kept = Option.getOrThrow(await Effect.runPromise(driver.adopt(s.id)))
      expect(kept).toEqual({ machine, note: "the caller's note" })
      // What adopt answers reaches the same machine.
      const out = await Effect.runPromise(
        Effect.scoped(
          Effect.flatMap(connect({ ...machine.ssh, privateKey: keys.client.private }), (g) =>
            g.bash({ command: "echo again" }),
          ),
        ),
      )
      expect(out.output).toBe("again\n")
      expect(Option.isNone(await Effect.runPromise(driver.adopt(never.id)))).toBe(true)
      process.kill(Number(machine.handle.pid), "SIGKILL")
      const deadline = Date.now() + 10_000
      while (Option.isSome(await Effect.runPromise(driver.adopt(s.id))) && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 20))
      expect(Option.isNone(await Effect.runPromise(driver.adopt(s.id)))).toBe(true)
    } finally {
      await Effect.runPromise(driver.destroy(s.id))
      await Effect.runPromise(driver.destroy(never.id))
    }
    expect(await leftovers(s.id)).toEqual([])
    expect(await Effect.runPromise(driver.adopt(s.id))).toEqual(Option.none())
  })

  it("pins the host key: a session expecting another key is refused", async () => {
    const s = spec("pin")
    const other = newKeys().host
    const exit = await Effect.runPromiseExit(
      Effect.scoped(
        Effect.gen(function* () {
          const machine = yield* scopedOn(driver, s)
          return yield* connect(
            { ...machine.ssh, hostKey: other.public, privateKey: keys.client.private },
            { readyTimeoutMs: 2_000 },
          )
        }),
      ),
    )
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(exit)).toContain("GuestUnavailable")
    expect(await leftovers(s.id)).toEqual([])
  })

  it("its mount program compiles with perl's warnings on, and none", () => {
    const program = fileURLToPath(new URL("./machine-root.pl", import.meta.url))
    const checked = spawnSync("perl", ["-wc", program], { encoding: "utf8" })
    expect(checked.status).toBe(0)
    expect(checked.stderr).toBe(`${program} syntax OK\n`)
  })

  it("refuses a bad id and leaves nothing", async () => {
    const exit = await Effect.runPromiseExit(driver.create(spec("x", { id: "Bad/Id" })))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(exit)).toContain("MachineCreateFailed")
  })

  it("a base that is not there fails the create at its mounts, naming them, and leaves nothing", async () => {
    const s = spec("nobase", { base: "/var/cache/hangar/bases/none/rootfs" })
    const exit = await Effect.runPromiseExit(driver.create(s))
    expect(Exit.isFailure(exit)).toBe(true)
    const failure = Exit.isFailure(exit) ? Option.getOrThrow(Cause.failureOption(exit.cause)) : undefined
    expect(failure).toMatchObject({ _tag: "MachineCreateFailed", step: "container" })
    expect(failure?.detail).toContain(
      "machine-root: idmapped mount: open_tree /var/cache/hangar/bases/none/rootfs: No such file or directory",
    )
    expect(await leftovers(s.id)).toEqual([])
  })

  it("a full /workspace is a real ENOSPC", async () => {
    const s = spec("full", { override: { diskBytes: 16 * 1024 * 1024 } })
    const out = await withMachine(s, (m) =>
      m.bash(
        "head -c 32M /dev/zero > /workspace/big; echo status=$?; df -B1 --output=size /workspace | tail -1",
      ),
    )
    expect(out.output).toContain("No space left on device")
    expect(out.output).toContain("status=1")
    expect(await leftovers(s.id)).toEqual([])
  })

  it("a machine's disk is a sparse copy of the empty disk of its size, its first files its root's, none left on the host, the empty disk unchanged", async () => {
    // A size of its own: its empty disk is made by this test's first machine.
    const bytes = 48 * 1024 * 1024 + 4096 * Math.floor(Math.random() * 1000)
    const templates = join(testDriverSettings.runDir, "disks")
    const templateOf = () =>
      readdirSync(templates)
        .filter((f) => f.startsWith(`workspace-${bytes}-`))
        .map((f) => join(templates, f))
    const [a, b] = [
      spec("diska", { override: { diskBytes: bytes } }),
      spec("diskb", { override: { diskBytes: bytes } }),
    ]
    try {
      const ma = await Effect.runPromise(driver.create(a))
      const [template, ...more] = templateOf()
      expect(more).toEqual([])
      if (template === undefined) throw new Error("no empty disk of the size was made")
      const before = readFileSync(template)
      expect(statSync(template).mode & 0o777).toBe(0o444)
      const dir = join(testDriverSettings.machinesDir, a.id)
      // Its data only: the rest of the image a hole, as the empty disk's.
      const image = statSync(join(dir, "disk.img"))
      expect(image.size).toBe(bytes)
      expect(image.blocks * 512).toBeLessThan(4 * 1024 * 1024)
      // Its first files were moved onto its disk: nothing of them (the host key) stays in its folder.
      expect(readdirSync(dir)).not.toContain("seed")
      const owners = await bashOn(
        ma,
        "stat -c '%u:%g %a %n' /etc/ssh/hangar_host_key /etc/ssh/hangar_authorized_keys /etc/ssh/sshd_config /run/sshd /workspace /workspace/in /workspace/out; head -c 1M /dev/urandom > /workspace/in/mine; sync",
      )
      expect(owners.exit_code).toBe(0)
      const lines = owners.output.trim().split("\n")
      expect(lines.map((l) => l.split(" ")[0])).toEqual(Array(7).fill("0:0"))
      expect(lines[0]).toBe("0:0 600 /etc/ssh/hangar_host_key")
      expect(lines[3]).toBe("0:0 755 /run/sshd")
      // A second machine of the size starts from the empty disk, not from the first's.
      const mb = await Effect.runPromise(driver.create(b))
      const listed = await bashOn(mb, "ls -A /workspace/in | wc -l")
      expect(listed.output.trim()).toBe("0")
      expect(readFileSync(template).equals(before)).toBe(true)
      expect(templateOf()).toEqual([template])
    } finally {
      await Effect.runPromise(driver.destroy(a.id))
      await Effect.runPromise(driver.destroy(b.id))
      for (const t of templateOf()) await rm(t, { force: true })
    }
    expect(await leftovers(a.id)).toEqual([])
    expect(await leftovers(b.id)).toEqual([])
  })

  it("a later machine is given the seccomp filter crun compiled for an earlier one, and it is in force; one that did not start has it compiled again", async () => {
    const [a, b, c] = [spec("filtera"), spec("filterb"), spec("filterc")]
    const stateOf = (id: string) => join(testDriverSettings.runDir, "crun", id)
    try {
      await Effect.runPromise(driver.create(a))
      const compiled = readFileSync(join(stateOf(a.id), "seccomp.bpf"))
      // Whole BPF instructions, the profile's hundreds of rules.
      expect(compiled.length % 8).toBe(0)
      expect(compiled.length).toBeGreaterThan(800)
      const mb = await Effect.runPromise(driver.create(b))
      const config = JSON.parse(
        readFileSync(join(testDriverSettings.machinesDir, b.id, "config.json"), "utf8"),
      )
      expect(config.annotations?.["run.oci.seccomp_bpf_data"]).toBe(compiled.toString("base64"))
      // crun loaded those bytes, and nothing else, into the machine's first process.
      expect(readFileSync(join(stateOf(b.id), "seccomp.bpf")).equals(compiled)).toBe(true)
      const pid = (mb.handle as { readonly pid: number }).pid
      expect(readFileSync(`/proc/${pid}/status`, "utf8")).toMatch(/Seccomp:\s+2\nSeccomp_filters:\s+1\n/)
      // The profile refuses unshare, which needs no capability for a user namespace.
      const refused = await bashOn(mb, "unshare --user true; echo status=$?")
      expect(refused.output).toContain("Operation not permitted")
      expect(refused.output).toContain("status=1")
      // A machine that did not start (here: no base) has the next one compile the section again,
      // in case the kept filter was why.
      const nobase = spec("nobase", { base: "/nonexistent/rootfs" })
      expect(Exit.isFailure(await Effect.runPromiseExit(driver.create(nobase)))).toBe(true)
      expect(await leftovers(nobase.id)).toEqual([])
      await Effect.runPromise(driver.create(c))
      const again = JSON.parse(
        readFileSync(join(testDriverSettings.machinesDir, c.id, "config.json"), "utf8"),
      )
      expect(again.annotations).toBeUndefined()
      expect(readFileSync(join(stateOf(c.id), "seccomp.bpf")).equals(compiled)).toBe(true)
    } finally {
      for (const m of [a, b, c]) await Effect.runPromise(driver.destroy(m.id))
    }
    for (const m of [a, b, c]) expect(await leftovers(m.id)).toEqual([])
  })

  it("a container that does not start fails the create at its container, its rules placed meanwhile, and leaves nothing", async () => {
    // crun as given, except that it refuses `run` (the machine's rules are placed meanwhile).
    const dir = await mkdtemp(join(tmpdir(), "hangar-crun-"))
    const crun = join(dir, "crun")
    await writeFile(
      crun,
      `#!/bin/sh\nfor a; do [ "$a" = run ] && { echo "refused to start" >&2; exit 1; }; done\nexec ${testDriverSettings.crun} "$@"\n`,
      { mode: 0o755 },
    )
    try {
      const s = spec("nostart")
      const exit = await Effect.runPromiseExit(make({ ...testDriverSettings, crun }).create(s))
      const failure = Exit.isFailure(exit) ? Option.getOrThrow(Cause.failureOption(exit.cause)) : undefined
      expect(failure).toMatchObject({ _tag: "MachineCreateFailed", step: "container" })
      expect(failure?.detail).toContain("refused to start")
      expect(await leftovers(s.id)).toEqual([])
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it("a machine whose first program ends at once fails the create and leaves nothing", async () => {
    // crun as given, except that the container runs `false` where sshd would start: it ends before
    // or while its network is made.
    const dir = await mkdtemp(join(tmpdir(), "hangar-crun-"))
    const crun = join(dir, "crun")
    await writeFile(
      crun,
      `#!/bin/sh\nsed -i 's#"/usr/sbin/sshd"#"/bin/false"#' config.json\nexec ${testDriverSettings.crun} "$@"\n`,
      { mode: 0o755 },
    )
    try {
      const s = spec("ends")
      const exit = await Effect.runPromiseExit(make({ ...testDriverSettings, crun }).create(s))
      const failure = Exit.isFailure(exit) ? Option.getOrThrow(Cause.failureOption(exit.cause)) : undefined
      expect(failure).toMatchObject({ _tag: "MachineCreateFailed" })
      expect(["network", "ready"]).toContain(failure?.step)
      expect(await leftovers(s.id)).toEqual([])
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it("leaves nothing after 5 create/destroy cycles", async () => {
    const ids: Array<string> = []
    for (let i = 0; i < 5; i++) {
      const s = spec(`cycle${i}`)
      ids.push(s.id)
      const out = await withMachine(s, (m) => m.bash("echo up"))
      expect(out.output).toBe("up\n")
    }
    for (const id of ids) expect(await leftovers(id)).toEqual([])
  })

  it("destroy ends processes that ignore SIGTERM and keep forking with the disk held open, and leaves nothing", async () => {
    // A short grace, so the SIGKILL half is reached quickly.
    const quick = make({ ...testDriverSettings, termGraceMs: 300 })
    const s = spec("stubborn")
    const machine = await Effect.runPromise(quick.create(s))
    try {
      const dir = `${testDriverSettings.machinesDir}/${s.id}`
      // The loop device as losetup finds it (by the image's inode) is the one the driver finds in sysfs.
      const listed = (await run("losetup", ["-n", "-O", "NAME", "-j", `${dir}/disk.img`])).trim().split("\n")
      expect(listed).toHaveLength(1)
      expect(loopsOf(dir)).toEqual(listed)
      const away = "echo $BASHPID > /sys/fs/cgroup/memory/cgroup.procs"
      const out = await Effect.runPromise(
        Effect.scoped(
          Effect.flatMap(connect({ ...machine.ssh, privateKey: keys.client.private }), (g) =>
            g.bash({
              command: [
                // Out of the command's process group and memory group (whose processes the command's
                // end kills), deaf to SIGTERM, a file on the disk open, and a child made every 10 ms.
                `setsid bash -c '${away}; trap "" TERM; exec 3>/workspace/held; while :; do sleep 0.01 & wait; done' </dev/null >/dev/null 2>&1 &`,
                `setsid bash -c '${away}; trap "" TERM HUP; while :; do (trap "" TERM; sleep 100) & sleep 0.05; done' </dev/null >/dev/null 2>&1 &`,
                "sleep 0.3; echo started",
              ].join("\n"),
            }),
          ),
        ),
      )
      expect(out.output).toBe("started\n")
      // The machine's pids group, which the kill looks at, holds every process of its groups in
      // every hierarchy (the commands' memory groups included). Compared with the machine frozen
      // (its freezer group), so no child comes or goes between the looks; zombies are left out.
      const root = testDriverSettings.cgroupRoot
      const freezer = join(Cgroups.groupOf(root, "freezer", s.id), "freezer.state")
      writeFileSync(freezer, "FROZEN")
      try {
        for (let i = 0; readFileSync(freezer, "utf8").trim() !== "FROZEN"; i++) {
          if (i > 1000) throw new Error("the machine did not freeze in 5 s")
          await new Promise((r) => setTimeout(r, 5))
        }
        const living = (pids: Iterable<number>) =>
          new Set(
            [...pids].filter((pid) => {
              const stat = readText(`/proc/${pid}/stat`) ?? ""
              const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3)
              return stat !== "" && state !== "Z" && state !== "X"
            }),
          )
        const everywhere = new Set<number>()
        const walk = async (dir: string): Promise<void> => {
          for (const e of await readdir(dir, { withFileTypes: true }).catch(() => []))
            if (e.isDirectory()) await walk(join(dir, e.name))
          for (const line of (await readFile(join(dir, "cgroup.procs"), "utf8").catch(() => "")).split("\n"))
            if (line !== "") everywhere.add(Number(line))
        }
        for (const h of Cgroups.hierarchies(root)) await walk(Cgroups.groupOf(root, h, s.id))
        const listed2 = await Cgroups.tasks(root, s.id)
        // They outlived their command: its children's `sleep 100` are running.
        const sleepers = listed2.filter((pid) =>
          (readText(`/proc/${pid}/cmdline`) ?? "").startsWith("sleep\u0000100"),
        )
        expect(sleepers.length).toBeGreaterThan(0)
        expect(living(everywhere).size).toBeGreaterThan(4)
        expect(living(listed2)).toEqual(living(everywhere))
      } finally {
        writeFileSync(freezer, "THAWED")
      }
      await Effect.runPromise(quick.destroy(s.id))
      expect(await leftovers(s.id)).toEqual([])
      expect(loopsOf(dir)).toEqual([])
    } finally {
      // Also when an assertion failed: its processes would go on forking.
      await Effect.runPromise(quick.destroy(s.id))
    }
  })

  it("makes machines on a thread of its own: a request it never answered fails, and the next thread serves", async () => {
    // A removal of a machine never made: the thread's program is built and the thread up.
    await Effect.runPromise(driver.destroy(testId("never")))
    await endMachineThread()
    // Asked of a thread just started, which is ended long before it has loaded its program.
    const lost = spec("lost")
    const asked = Effect.runPromiseExit(driver.create(lost))
    await new Promise((r) => setImmediate(r))
    await endMachineThread()
    const exit = await asked
    expect(Exit.isFailure(exit)).toBe(true)
    const error = Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()
    expect(Option.getOrThrow(error)).toMatchObject({
      _tag: "MachineCreateFailed",
      id: lost.id,
      detail: expect.stringContaining("the machine thread exited"),
    })
    expect(await leftovers(lost.id)).toEqual([])
    // The next request starts a new thread, which makes and removes machines as before.
    await withMachine(spec("next"), async (m) => {
      expect((await m.bash("echo again")).output).toBe("again\n")
    })
    await Effect.runPromise(driver.destroy(lost.id))
    expect(await leftovers(lost.id)).toEqual([])
  })

  it("a machine made in the background yields the CPU until wanted, and nothing in it runs niced", async () => {
    const weight = (id: string) =>
      Number(readText(join(Cgroups.groupOf(testDriverSettings.cgroupRoot, "cpu", id), "cpu.shares")))
    const behind = spec("behind", { background: true })
    await withMachine(behind, async (m) => {
      // Made with nothing else under way: the thread and the tools it started ran in the
      // background, and its processes' group weighs as a task at that nice.
      expect(await machineThreadPriority()).toEqual({ thread: backgroundNice(), tools: backgroundNice() })
      expect(weight(behind.id)).toBe(BACKGROUND_WEIGHT)
      // Inside, its root and its first process (sshd) run at the host agent's nice (0 unless its
      // operator chose another): the weight is the host's to change.
      expect((await m.bash("nice; cut -d' ' -f19 /proc/1/stat")).output).toBe(
        `${normalNice()}\n${normalNice()}\n`,
      )
      await Effect.runPromise(driver.wanted(behind.id))
      expect(weight(behind.id)).toBe(NORMAL_WEIGHT)
    })
    expect(await leftovers(behind.id)).toEqual([])

    // A run's own machine: made at the host agent's nice, and weighs what the kernel gives any group.
    const own = spec("own")
    await withMachine(own, async () => {
      expect(await machineThreadPriority()).toEqual({ thread: normalNice(), tools: normalNice() })
      expect(weight(own.id)).toBe(NORMAL_WEIGHT)
    })

    // Wanted before its request was sent (`create` begins at once, the request is sent once the
    // thread is there), and wanted while it is being made: made as a run's.
    const first = spec("wantfirst", { background: true })
    const made: Array<MachineSpec> = [first]
    try {
      const making = Effect.runPromise(driver.create(first))
      await Effect.runPromise(driver.wanted(first.id))
      await making
      expect(await machineThreadPriority()).toEqual({ thread: normalNice(), tools: normalNice() })
      expect(weight(first.id)).toBe(NORMAL_WEIGHT)
      // Midway: tried again should the making have ended before the want was sent (it takes
      // ~100 ms after its folder, the first step, is there).
      let midway = false
      for (let attempt = 0; attempt < 3 && !midway; attempt++) {
        const s = spec(`wantmidway${attempt}`, { background: true })
        made.push(s)
        let ended = false
        const begun = Effect.runPromise(driver.create(s)).finally(() => {
          ended = true
        })
        while ((await readdir(testDriverSettings.machinesDir)).every((f) => f !== s.id))
          await new Promise((r) => setTimeout(r, 1))
        midway = !ended
        await Effect.runPromise(driver.wanted(s.id))
        await begun
        if (!midway) continue
        expect(await machineThreadPriority()).toEqual({ thread: normalNice(), tools: normalNice() })
        expect(weight(s.id)).toBe(NORMAL_WEIGHT)
      }
      expect(midway).toBe(true)
    } finally {
      // Also when an assertion failed (a create that failed removed its own).
      for (const s of made) await Effect.runPromise(driver.destroy(s.id))
    }
    for (const s of [own, ...made]) expect(await leftovers(s.id)).toEqual([])
  })

  it("two machines run side by side on separate networks", async () => {
    const a = spec("a")
    const b = spec("b")
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const [ma, mb] = yield* Effect.all(
            [a, b].map((s) => scopedOn(driver, s)),
            { concurrency: 2 },
          )
          expect(ma?.ssh.host).not.toBe(mb?.ssh.host)
        }),
      ),
    )
    expect(await leftovers(a.id)).toEqual([])
    expect(await leftovers(b.id)).toEqual([])
  })
})
