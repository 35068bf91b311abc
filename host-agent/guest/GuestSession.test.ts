import { type AddressInfo, createServer } from "node:net"
import { Cause, Effect, Exit, Fiber, Option, Scope } from "effect"
import ssh2 from "ssh2"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ensureTestBase } from "../bases/Bases.ts"
import { scopedOn } from "../machines/MachineDriver.ts"
import { make } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, newKeys, testDriverSettings, testId } from "../machines/namespace/testing.ts"
import { READ_MAX_BYTES } from "./Files.ts"
import { type BashArgs, connect, type GuestEndpoint, type GuestSession } from "./GuestSession.ts"
import { IMAGE_MAX_BYTES } from "./Images.ts"
import { testGuest } from "./testing.ts"

const driver = make(testDriverSettings)
const keys = newKeys()
const id = testId("guest")
let scope: Scope.CloseableScope
let guest: GuestSession
/** The machine's SSH endpoint with the key `guest` logs in with (for more sessions to it). */
let endpoint: GuestEndpoint

beforeAll(async () => {
  const base = await ensureTestBase()
  scope = Effect.runSync(Scope.make())
  guest = await Effect.runPromise(
    Scope.extend(
      Effect.gen(function* () {
        const machine = yield* scopedOn(driver, {
          id,
          size: "s",
          base: base.rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
          // A small memory limit so the OOM case is quick.
          override: { memoryBytes: 256 * 1024 * 1024 },
        })
        endpoint = { ...machine.ssh, privateKey: keys.client.private }
        return yield* connect(endpoint)
      }),
      scope,
    ),
  )
}, 15 * 60_000)

afterAll(async () => {
  await Effect.runPromise(Scope.close(scope, Exit.void))
  expect(await leftovers(id)).toEqual([])
})

const bash = (command: string, extra: Partial<BashArgs> = {}) =>
  Effect.runPromise(guest.bash({ command, ...extra }))
const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(e)

describe("bash", () => {
  it("runs in /workspace with env and workdir, and reports the exit code", async () => {
    expect(await bash("echo hi")).toEqual({
      exit_code: 0,
      output: "hi\n",
      output_bytes: 3,
      truncated: false,
      timed_out: false,
      oom_killed: false,
    })
    expect((await bash("pwd")).output).toBe("/workspace\n")
    await bash("mkdir -p /workspace/sub")
    const r = await bash('pwd; echo "$FOO|$BAR"; echo err >&2; exit 3', {
      workdir: "sub",
      env: { FOO: "a b", BAR: "x\ny" },
    })
    expect(r.exit_code).toBe(3)
    expect(r.output).toBe("/workspace/sub\na b|x\ny\nerr\n")
  })

  it("only files carry over between commands", async () => {
    await bash("export KEEP=1; cd /tmp; echo file > /workspace/carried")
    expect((await bash('echo "[$KEEP]"; pwd; cat carried')).output).toBe("[]\n/workspace\nfile\n")
  })

  it("accepts timeout_ms up to 24 hours and refuses one more", async () => {
    expect((await bash("true", { timeout_ms: 24 * 60 * 60_000 })).exit_code).toBe(0)
    const exit = await Effect.runPromiseExit(
      guest.bash({ command: "true", timeout_ms: 24 * 60 * 60_000 + 1 }),
    )
    expect(String(exit)).toContain("timeout_ms")
    const bad = await Effect.runPromiseExit(guest.bash({ command: "true", env: { "1X": "v" } }))
    expect(String(bad)).toContain("InvalidArguments")
  })

  it("a command over timeout_ms is timed_out and its processes are gone", async () => {
    const r = await bash("sleep 100 & sleep 100; echo never", { timeout_ms: 300 })
    expect(r.timed_out).toBe(true)
    expect(r.output).not.toContain("never")
    expect((await bash("pgrep -x sleep | wc -l")).output).toBe("0\n")
  })

  it("keeps the first and last 16 KiB of 10 MiB of output and streams all of it", async () => {
    let streamed = 0
    const r = await Effect.runPromise(
      guest.bash({ command: "seq 1 2000000 | head -c 10485760" }, (chunk) => {
        streamed += chunk.length
      }),
    )
    expect(r.output_bytes).toBe(10485760)
    expect(streamed).toBe(10485760)
    expect(r.truncated).toBe(true)
    const [head, tail] = r.output.split(`\n[... ${10485760 - 32768} bytes omitted ...]\n`)
    expect(head?.startsWith("1\n2\n3\n")).toBe(true)
    expect(Buffer.byteLength(head ?? "")).toBe(16384)
    expect(Buffer.byteLength(tail ?? "")).toBe(16384)
  })

  it("at 32 KiB of output nothing is cut; one byte more is truncated", async () => {
    const at = await bash("head -c 32768 /dev/zero | tr '\\0' a")
    expect(at.truncated).toBe(false)
    expect(at.output).toBe("a".repeat(32768))
    const over = await bash("head -c 32769 /dev/zero | tr '\\0' a")
    expect(over.truncated).toBe(true)
    expect(over.output_bytes).toBe(32769)
    expect(over.output).toContain("[... 1 bytes omitted ...]")
  })

  it("passes non-UTF-8 bytes as replacement characters and counts the bytes", async () => {
    const r = await bash("printf 'ok\\xff\\xfe\\xc3'")
    expect(r.output).toBe("ok\uFFFD\uFFFD\uFFFD")
    expect(r.output_bytes).toBe(5)
  })

  it("a command allocating past the memory limit is oom_killed, its other processes die, the machine goes on", async () => {
    const r = await bash("sleep 100 & python3 -c \"x = b'a' * (600 * 1024 * 1024)\"; echo after=$?")
    expect(r.oom_killed).toBe(true)
    expect(r.output).toContain("after=137")
    expect((await bash("pgrep -x sleep | wc -l; echo still")).output).toBe("0\nstill\n")
    expect((await bash("python3 -c 'print(1+1)'")).oom_killed).toBe(false)
  })

  it("cancel kills the whole process tree, even processes that left the group", async () => {
    let sawStart: () => void = () => undefined
    const started = new Promise<void>((ok) => {
      sawStart = ok
    })
    const fiber = Effect.runFork(
      guest.bash(
        {
          // "started" once all three sleeps exist (a forked bash execs its sleep a moment later).
          command:
            "sleep 1000 & (setsid sleep 1000 &); bash -c 'sleep 1000' & until [ $(pgrep -x sleep | wc -l) -ge 3 ]; do :; done; echo started; wait",
        },
        (c) => {
          if (Buffer.from(c).toString().includes("started")) sawStart()
        },
      ),
    )
    await started
    expect((await bash("pgrep -x sleep | wc -l")).output).toBe("3\n")
    await Effect.runPromise(Fiber.interrupt(fiber))
    expect((await bash("pgrep -x sleep | wc -l")).output).toBe("0\n")
  })

  it("a waiting wrapper killed (the OOM killer's first pick) costs the next command nothing: it runs whole", async () => {
    // Between commands the only processes in command slots are the session's waiting wrapper
    // (opened as the command before is over): killed once it is in its slot; exit 1 if it never is.
    const killWaiting = `for ((j = 0; j < 400; j++)); do for cg in /sys/fs/cgroup/memory/p*; do mapfile -t ps < "$cg/cgroup.procs"; [ \${#ps[@]} -gt 0 ] && { kill -9 "\${ps[@]}"; exit 0; }; done; sleep 0.005; done; exit 1`
    for (let i = 0; i < 5; i++) {
      expect((await bash("true")).exit_code).toBe(0)
      const { channel, exit } = await run(guest.channel(killWaiting))
      channel.resume()
      channel.stderr.resume()
      channel.end()
      expect((await exit).code).toBe(0)
      expect(await bash(`echo whole-${i}`)).toMatchObject({
        exit_code: 0,
        output: `whole-${i}\n`,
        oom_killed: false,
      })
    }
  })

  it("opens the next command's wrapper once a command is over, not beside it: a running command has the slots to itself", async () => {
    // The slots holding processes, each on a line.
    const busySlots = `for cg in /sys/fs/cgroup/memory/p*; do mapfile -t ps < "$cg/cgroup.procs"; [ \${#ps[@]} -gt 0 ] && echo "\${cg##*/}"; done; true`
    expect((await bash("true")).exit_code).toBe(0)
    for (let i = 0; i < 3; i++) {
      // Long enough for a wrapper opened as it started to be in its slot by the time it looks.
      const running = await bash(`sleep 0.3; ${busySlots}`)
      expect(running.output.trim().split("\n")).toHaveLength(1)
    }
    // Once it is over, the next wrapper waits in a slot of its own.
    const { channel, exit } = await run(
      guest.channel(
        `for ((j = 0; j < 400; j++)); do [ -n "$(${busySlots})" ] && exit 0; sleep 0.005; done; exit 1`,
      ),
    )
    channel.resume()
    channel.stderr.resume()
    channel.end()
    expect((await exit).code).toBe(0)
  })

  it("runs commands concurrently", async () => {
    const [waiter, setter] = await run(
      Effect.all(
        [
          guest.bash({
            command: "while [ ! -f /tmp/flag ]; do sleep 0.01; done; echo got",
            timeout_ms: 20_000,
          }),
          guest.bash({ command: "sleep 0.2; touch /tmp/flag; echo set" }),
        ],
        { concurrency: "unbounded" },
      ),
    )
    expect(waiter.output).toBe("got\n")
    expect(setter.output).toBe("set\n")
  })
})

describe("a session taking a machine over (clearLeftovers)", () => {
  it("kills what the earlier session's commands left running, and its own first command runs whole", async () => {
    // A machine of its own: taking over kills what every other session has in its command slots.
    const tg = await testGuest("takeover")
    try {
      const endpoint = { ...tg.machine.ssh, privateKey: tg.privateKey }
      // The earlier session's command, left running when its connection goes.
      const left = Effect.runFork(tg.guest.bash({ command: "echo $$ > /workspace/left.pid; exec sleep 300" }))
      let pid = ""
      for (let i = 0; i < 500 && pid === ""; i++) {
        const read = await Effect.runPromiseExit(tg.guest.read({ file_path: "left.pid" }))
        if (Exit.isSuccess(read) && "output" in read.value) pid = read.value.output.trim()
        if (pid === "") await new Promise((r) => setTimeout(r, 20))
      }
      expect(pid).toMatch(/^\d+$/)
      // Three sessions in turn take the machine over; each one's first command runs whole.
      for (let i = 0; i < 3; i++) {
        const s = Effect.runSync(Scope.make())
        const taker = await run(Scope.extend(connect(endpoint, { clearLeftovers: true }), s))
        expect(await run(taker.bash({ command: "echo whole" }))).toMatchObject({
          exit_code: 0,
          output: "whole\n",
        })
        expect(
          (await run(taker.bash({ command: `kill -0 ${pid} 2>/dev/null && echo alive || echo gone` })))
            .output,
        ).toBe("gone\n")
        await run(Scope.close(s, Exit.void))
      }
      await Effect.runPromise(Fiber.interrupt(left))
    } finally {
      expect(await tg.close()).toEqual([])
    }
  }, 120_000)
})

describe("the file channel", () => {
  // The machine's SFTP sessions: each is a child of sshd titled `sshd: root@internal-sftp`.
  const sftpSessions = async () =>
    Number(
      (
        await bash(
          `n=0; for f in /proc/[0-9]*/cmdline; do IFS= read -r -d '' c < "$f" 2>/dev/null; [[ $c == *@internal-sftp* ]] && n=$((n + 1)); done; echo $n`,
        )
      ).output,
    )

  it("opens with a session's first file command, not with its connect: a session that reads no file holds no SFTP session", async () => {
    const before = await sftpSessions()
    const s = Effect.runSync(Scope.make())
    try {
      const other = await run(Scope.extend(connect(endpoint), s))
      expect(await run(other.bash({ command: "echo ran" }))).toMatchObject({ exit_code: 0, output: "ran\n" })
      expect(await sftpSessions()).toBe(before)
      expect(await run(other.list({ path: "." }))).toMatchObject({ truncated: false })
      expect(await sftpSessions()).toBe(before + 1)
      // Its later calls use the one it opened.
      await run(other.write({ file_path: "channel.txt", content: "one\n" }))
      expect(await run(other.read({ file_path: "channel.txt" }))).toEqual({ output: "one\n" })
      expect(await sftpSessions()).toBe(before + 1)
    } finally {
      await run(Scope.close(s, Exit.void))
    }
  })
})

describe("read", () => {
  it("returns lines from offset (counting from 1) up to limit, relative to /workspace", async () => {
    await run(guest.write({ file_path: "lines.txt", content: "l1\nl2\nl3\nl4\n" }))
    // The file's bytes, nothing added or removed: its trailing newline comes back.
    expect(await run(guest.read({ file_path: "lines.txt" }))).toEqual({ output: "l1\nl2\nl3\nl4\n" })
    expect(await run(guest.read({ file_path: "/workspace/lines.txt", offset: 2, limit: 2 }))).toEqual({
      output: "l2\nl3\n",
    })
    expect(await run(guest.read({ file_path: "lines.txt", offset: 4 }))).toEqual({ output: "l4\n" })
    expect(await run(guest.read({ file_path: "lines.txt", offset: 5 }))).toEqual({ output: "" })
    // No newline at the end, CRLF endings, blank lines and an empty file, each as they are.
    for (const content of ["a\nb", "a\r\nb\r\n", "\n\nx\n\n", "", "\n", "ü€\n𝄞"]) {
      await run(guest.write({ file_path: "exact.txt", content }))
      expect(await run(guest.read({ file_path: "exact.txt" })), JSON.stringify(content)).toEqual({
        output: content,
      })
    }
    expect(await run(guest.read({ file_path: "missing.txt" }))).toEqual({
      error: "/workspace/missing.txt: no such file or folder",
    })
  })

  it("a request that makes the machine close the file channel fails alone: the next file command opens a new one", async () => {
    // The API refuses such a path (schema/Command.ts); here it reaches the machine's SFTP server,
    // which closes the channel on it.
    await run(guest.write({ file_path: "kept.txt", content: "kept\n" }))
    const bad = await Effect.runPromiseExit(guest.read({ file_path: "a\u0000b" }))
    expect(Exit.isFailure(bad)).toBe(true)
    expect(String(bad)).toContain("GuestUnavailable")
    for (let i = 0; i < 3; i++) {
      expect(await run(guest.read({ file_path: "kept.txt" }))).toEqual({ output: "kept\n" })
      expect(await run(guest.write({ file_path: `again${i}.txt`, content: "x" }))).toEqual({ bytes: 1 })
      expect(await run(guest.list({ path: "." }))).toMatchObject({ truncated: false })
    }
  })

  it("never holds more than the cap: a device is refused, a file without newlines stops at 1 MiB", async () => {
    expect(await run(guest.read({ file_path: "/dev/zero" }))).toEqual({
      error: "/dev/zero: not a regular file",
    })
    await bash("head -c 3M /dev/zero | tr '\\0' a > long.txt")
    const long = await run(guest.read({ file_path: "long.txt" }))
    if (!("output" in long)) throw new Error(JSON.stringify(long))
    expect(long.output.startsWith("a".repeat(1000))).toBe(true)
    expect(long.output.length).toBeLessThan(READ_MAX_BYTES + 200_000)
    expect(long.output).toContain("[... read stops at")
  })

  // A PNG header of the given size, padded with bytes after it to `bytes`.
  const png = (name: string, side: number, bytes: number) =>
    bash(
      `python3 -c "
import struct,zlib,sys
ihdr = struct.pack('>IIBBBBB', ${side}, ${side}, 8, 2, 0, 0, 0)
head = b'\\x89PNG\\r\\n\\x1a\\n' + struct.pack('>I', 13) + b'IHDR' + ihdr + struct.pack('>I', zlib.crc32(b'IHDR' + ihdr))
open('${name}', 'wb').write(head + b'\\0' * (${bytes} - len(head)))
"`,
    )

  it("returns an image of exactly 3.75 MiB as a data URL and refuses one byte more", async () => {
    await png("at.png", 100, IMAGE_MAX_BYTES)
    await png("over.png", 100, IMAGE_MAX_BYTES + 1)
    const at = await run(guest.read({ file_path: "at.png" }))
    expect("image_url" in at && at.image_url.startsWith("data:image/png;base64,")).toBe(true)
    if ("image_url" in at)
      expect(Buffer.from(at.image_url.split(",")[1] ?? "", "base64").length).toBe(IMAGE_MAX_BYTES)
    const over = await run(guest.read({ file_path: "over.png" }))
    expect(over).toEqual({ error: expect.stringContaining("3.75 MiB") })
  })

  it("accepts 2000 pixels a side and refuses 2001", async () => {
    await png("side2000.png", 2000, 1000)
    await png("side2001.png", 2001, 1000)
    expect("image_url" in (await run(guest.read({ file_path: "side2000.png" })))).toBe(true)
    expect(await run(guest.read({ file_path: "side2001.png" }))).toEqual({
      error: expect.stringContaining("2001x2001"),
    })
  })
})

describe("write and edit", () => {
  it("write makes parent folders and reports the bytes", async () => {
    expect(await run(guest.write({ file_path: "w/x/y/z.txt", content: "héllo" }))).toEqual({ bytes: 6 })
    expect((await bash("cat w/x/y/z.txt")).output).toBe("héllo")
  })

  it("edit applies every edit, atomically", async () => {
    await run(guest.write({ file_path: "e.txt", content: "alpha beta gamma" }))
    expect(
      await run(
        guest.edit({
          file_path: "e.txt",
          edits: [
            { old_text: "alpha", new_text: "A" },
            { old_text: "gamma", new_text: "G" },
          ],
        }),
      ),
    ).toEqual({ applied: 2 })
    expect((await bash("cat e.txt; ls -a | grep -c edit- || true")).output).toBe("A beta G0\n")
  })

  it("an old_text found twice (or not at all) applies nothing", async () => {
    await run(guest.write({ file_path: "twice.txt", content: "one two two" }))
    const twice = await run(
      guest.edit({
        file_path: "twice.txt",
        edits: [
          { old_text: "one", new_text: "1" },
          { old_text: "two", new_text: "2" },
        ],
      }),
    )
    expect(twice).toEqual({
      error: "edits[1].old_text occurs 2 times, must occur exactly once; nothing applied",
    })
    const none = await run(
      guest.edit({ file_path: "twice.txt", edits: [{ old_text: "three", new_text: "3" }] }),
    )
    expect(none).toEqual({ error: expect.stringContaining("occurs 0 times") })
    expect((await bash("cat twice.txt")).output).toBe("one two two")
  })
})

describe("list", () => {
  it("lists 1,000 entries and marks 1,001 truncated; links are skipped", async () => {
    await bash(
      "mkdir -p l1000 l1001 && cd l1000 && touch $(seq -w 1 1000) && cd ../l1001 && touch $(seq -w 1 1001)",
    )
    const at = await run(guest.list({ path: "l1000" }))
    expect("entries" in at && at.entries.length === 1000 && !at.truncated).toBe(true)
    const over = await run(guest.list({ path: "l1001" }))
    expect("entries" in over && over.entries.length === 1000 && over.truncated).toBe(true)
  })

  it("gives files with size and folders, by name, and does not follow links", async () => {
    await bash("mkdir -p mixed/dir && printf abc > mixed/f && ln -s /etc mixed/link && ln -s f mixed/flink")
    expect(await run(guest.list({ path: "mixed" }))).toEqual({
      entries: [
        { name: "dir", type: "folder" },
        { name: "f", type: "file", size: 3 },
      ],
      truncated: false,
      skipped: ["flink", "link"],
    })
    expect(await run(guest.list({ path: "mixed/f" }))).toEqual({ error: "/workspace/mixed/f: not a folder" })
  })
})

describe("connect", () => {
  /**
   * An SSH server (ssh2's) that records each publickey request: whether it came signed, and
   * whether the signature is the authorized key's. `refuse` turns every key down.
   */
  const recordingServer = async (refuse: boolean) => {
    const authorized = ssh2.utils.parseKey(keys.client.public)
    if (authorized instanceof Error) throw authorized
    const requests: Array<{ signed: boolean; verified: boolean }> = []
    const server = new ssh2.Server({ hostKeys: [keys.host.private] }, (client) => {
      client.on("error", () => undefined)
      client.on("authentication", (ctx) => {
        if (ctx.method !== "publickey") return ctx.reject(["publickey"])
        const signed = ctx.signature !== undefined
        const verified =
          signed &&
          ctx.key.data.equals(authorized.getPublicSSH()) &&
          authorized.verify(ctx.blob as Buffer, ctx.signature as Buffer, ctx.hashAlgo) === true
        requests.push({ signed, verified })
        return !refuse && verified ? ctx.accept() : ctx.reject(["publickey"])
      })
      client.on("session", (accept) => accept().on("exec", (_accept, reject) => reject()))
    })
    await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
    const parsed = ssh2.utils.parseKey(keys.host.private)
    if (parsed instanceof Error) throw parsed
    const endpoint = {
      host: "127.0.0.1",
      port: (server.address() as AddressInfo).port,
      hostKey: `${parsed.type} ${parsed.getPublicSSH().toString("base64")}`,
      privateKey: keys.client.private,
    }
    return { endpoint, requests, close: () => server.close() }
  }

  it("logs in with one signed request: the key is not asked about first", async () => {
    const server = await recordingServer(false)
    try {
      const exit = await Effect.runPromiseExit(Effect.scoped(connect(server.endpoint)))
      expect(Exit.isSuccess(exit)).toBe(true)
      expect(server.requests).toEqual([{ signed: true, verified: true }])
    } finally {
      server.close()
    }
  })

  it("a key the machine refuses fails the connect, each attempt a signed request", async () => {
    const server = await recordingServer(true)
    try {
      const exit = await Effect.runPromiseExit(
        Effect.scoped(connect(server.endpoint, { readyTimeoutMs: 100 })),
      )
      const failure = Exit.isFailure(exit)
        ? Option.getOrUndefined(Cause.failureOption(exit.cause))
        : undefined
      expect(failure?.detail).toContain("authentication methods failed")
      expect(server.requests.length).toBeGreaterThan(0)
      for (const r of server.requests) expect(r).toEqual({ signed: true, verified: true })
    } finally {
      server.close()
    }
  })

  it("an sshd that sends a garbled packet, then resets, fails the connect with every error handled", async () => {
    // The machine's root controls its sshd: a garbled packet then a reset gives two errors, and
    // the second was thrown in the host agent, outside any listener (the process's end).
    const server = createServer((socket) => {
      socket.on("error", () => undefined)
      socket.write("SSH-2.0-OpenSSH_9.2\r\n")
      socket.write(Buffer.alloc(64, 0xff))
      setTimeout(() => socket.resetAndDestroy(), 20)
    })
    await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
    const thrown: Array<unknown> = []
    const onThrown = (e: unknown) => thrown.push(e)
    process.on("uncaughtException", onThrown)
    try {
      const parsed = ssh2.utils.parseKey(keys.host.private)
      if (parsed instanceof Error) throw parsed
      const exit = await Effect.runPromiseExit(
        Effect.scoped(
          connect(
            {
              host: "127.0.0.1",
              port: (server.address() as AddressInfo).port,
              hostKey: `${parsed.type} ${parsed.getPublicSSH().toString("base64")}`,
              privateKey: keys.client.private,
            },
            { readyTimeoutMs: 200 },
          ),
        ),
      )
      expect(Exit.isFailure(exit) && String(exit.cause)).toContain("GuestUnavailable")
      // The resets of the last attempts come after the connect gave up.
      await new Promise((r) => setTimeout(r, 200))
      expect(thrown).toEqual([])
    } finally {
      process.off("uncaughtException", onThrown)
      server.close()
    }
  })
})
