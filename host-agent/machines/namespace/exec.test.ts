/**
 * Host tools through the helper process (`exec.ts`, `exec-helper.py`): output, input (more than
 * a pipe holds, and to a tool that reads none), failures with the tool's own message, a tool ended
 * by a signal, an argument no program can take (its call fails, the helper goes on), an nft
 * script run in the helper (one transaction, nft's errors, others' changes seen), a tool's
 * descriptors (its stdio only, never the helper's nft socket) and signals (at their defaults), a
 * helper that a Ctrl-C leaves running, a helper that died (its calls fail, the next call starts
 * another) or whose parent went (it ends too), and `launch`, whose end is the tool's exit even when
 * what it started holds its log open (and which says there why a tool could not start), and which
 * hands a tool a sealed copy of a program (kept while the file is unchanged); and a helper that is never told its tools ended (SIGCHLD lost) still
 * answers.
 */
import { spawn, spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import { existsSync } from "node:fs"
import { copyFile, mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { frame, frames, helperInterpreter, helperPath, launch, nft, run } from "./exec.ts"

let dir: string
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-exec-"))
})
afterAll(async () => {
  await rm(dir, { recursive: true, force: true })
})

/** The helper's pid: the parent of a tool it runs. */
const helperPid = async () => Number((await run("sh", ["-c", "echo $PPID"])).trim())

describe("exec", () => {
  it("answers a tool's output, gives it its input, and runs many at once", async () => {
    expect(await run("sh", ["-c", "echo out; echo err >&2"])).toBe("out\n")
    expect(await run("tr", ["a-z", "A-Z"], { input: "piped in\n" })).toBe("PIPED IN\n")
    const many = await Promise.all(Array.from({ length: 20 }, (_, i) => run("echo", [String(i)])))
    expect(many).toEqual(Array.from({ length: 20 }, (_, i) => `${i}\n`))
  })

  it("takes and gives more than a pipe holds, in bytes as they are, and feeds no tool that reads none", async () => {
    const input = `${"é".repeat(300_000)}\n`
    expect(await run("wc", ["-c"], { input })).toBe(`${Buffer.byteLength(input)}\n`)
    expect(await run("cat", [], { input })).toBe(input)
    const out = await run("sh", [
      "-c",
      "head -c 1000000 /dev/zero | tr '\\0' x; head -c 300000 /dev/zero >&2",
    ])
    expect(out).toBe("x".repeat(1_000_000))
    expect(await run("true", [], { input })).toBe("")
  })

  it("a tool ended by a signal fails as such", async () => {
    await expect(run("sh", ["-c", "kill -KILL $$"])).rejects.toThrow("sh -c kill -KILL $$ exited null")
  })

  it("fails with the command, its exit code and its stderr; a missing tool fails naming it", async () => {
    await expect(run("sh", ["-c", "echo partial; echo 'no such table' >&2; exit 3"])).rejects.toThrow(
      "sh -c echo partial; echo 'no such table' >&2; exit 3 exited 3: no such table",
    )
    await expect(run("/nonexistent/tool", ["x"])).rejects.toThrow(
      "/nonexistent/tool: spawn /nonexistent/tool ENOENT",
    )
  })

  it("an argument no program can be given (a NUL in it) fails its call, and the helper goes on", async () => {
    const pid = await helperPid()
    await expect(run("echo", ["a\0b"])).rejects.toThrow("echo: spawn echo embedded null byte")
    expect(await helperPid()).toBe(pid)
  })

  it("tools are started by the helper, not by this process", async () => {
    const pid = await helperPid()
    expect(pid).not.toBe(process.pid)
    expect(await readFile(`/proc/${pid}/cmdline`, "utf8")).toContain("exec-helper.py")
  })

  it("runs an nft script in the helper as one transaction, failing as nft would, and sees other programs' changes", async () => {
    const table = `hangar_exec_${process.pid}`
    const listed = () => run("nft", ["list", "tables", "inet"])
    try {
      await nft(`add table inet ${table}\nadd chain inet ${table} one\n`)
      expect(await run("nft", ["list", "chain", "inet", table, "one"])).toContain(`chain one {`)
      // A script whose second command fails changes nothing: its first is not applied either.
      await expect(
        nft(`add chain inet ${table} two\nadd rule inet ${table} nosuchchain accept\n`),
      ).rejects.toThrow(/^nft -f - exited 1: \S+:2:\d+-\d+: Error: .*\n.*nosuchchain/)
      await expect(run("nft", ["list", "chain", "inet", table, "two"])).rejects.toThrow(
        "No such file or directory",
      )
      // A set made by another program is in the helper's view of the ruleset: an element is read
      // by the set's type from that view before anything is sent (a view kept from before the set
      // would refuse it there, as `nft` refuses an element of a set not made yet).
      await run("nft", ["add", "set", "inet", table, "theirs", "{ type ipv4_addr; }"])
      await nft(`add element inet ${table} theirs { 10.0.0.1 }\n`)
      expect(await run("nft", ["list", "set", "inet", table, "theirs"])).toContain("10.0.0.1")
      // The table removed by another program: the helper's next script sees it gone.
      await run("nft", ["delete", "table", "inet", table])
      await expect(nft(`add chain inet ${table} three\n`)).rejects.toThrow(
        /exited 1: \S+:1:\d+-\d+: Error: .*No such file or directory/,
      )
      expect(await listed()).not.toContain(table)
    } finally {
      await run("nft", ["delete", "table", "inet", table]).catch(() => undefined)
    }
  })

  it("a tool holds no descriptor of the helper's, its nft socket included: only its stdin, stdout and stderr", async () => {
    // After a script, the helper holds libnftables' netlink socket (root's, able to change the
    // host's firewall). Each descriptor the tool has, but its own listing's.
    await nft("add table inet hangar_exec_fds\ndelete table inet hangar_exec_fds\n")
    const held = (await run("ls", ["-l", "/proc/self/fd"])).split("\n").flatMap((l) => {
      const [, fd, target] = / (\d+) -> (.*)$/.exec(l) ?? []
      return fd === undefined || target?.startsWith("/proc/") ? [] : [Number(fd)]
    })
    expect(held.sort()).toEqual([0, 1, 2])
  })

  it("a tool starts with no signal ignored or blocked; the helper outlives a terminal's Ctrl-C", async () => {
    // The standard signals (1–31) of the tool's masks; glibc's posix_spawn leaves its own two
    // (32 and 33, for threads) ignored, and a program that uses them sets them itself.
    const signals = async () =>
      Object.fromEntries(
        (await run("grep", ["^Sig\\(Ign\\|Blk\\)", "/proc/self/status"]))
          .trim()
          .split("\n")
          .map((l) => l.split(":\t"))
          .map(([name, hex]) => [name, BigInt(`0x${hex}`) & 0x7fffffffn]),
      )
    const none = { SigBlk: 0n, SigIgn: 0n }
    expect(await signals()).toEqual(none)
    const pid = await helperPid()
    process.kill(pid, "SIGINT")
    expect(await signals()).toEqual(none)
    expect(await helperPid()).toBe(pid)
  })

  it("a helper that dies fails the calls it had, and the next call starts another", async () => {
    const pid = await helperPid()
    const pending = run("sleep", ["5"])
    process.kill(pid, "SIGKILL")
    await expect(pending).rejects.toThrow("the tool runner exited (SIGKILL)")
    expect(await run("echo", ["again"])).toBe("again\n")
    expect(await helperPid()).not.toBe(pid)
  })

  it("the helper ends with the process that started it", () => {
    const child = spawnSync(
      process.execPath,
      [
        "--import",
        "tsx",
        "--input-type=module",
        "-e",
        `import { run } from ${JSON.stringify(new URL("./exec.ts", import.meta.url).pathname)}; console.log((await run("sh", ["-c", "echo $PPID"])).trim())`,
      ],
      { encoding: "utf8", timeout: 30_000 },
    )
    expect(child.status, child.stderr).toBe(0)
    const pid = Number(child.stdout.trim())
    expect(pid).toBeGreaterThan(0)
    expect(pid).not.toBe(child.pid)
    // Gone (reaped by init once its stdin ended), not left behind.
    const until = Date.now() + 5_000
    while (existsSync(`/proc/${pid}`) && Date.now() < until) spawnSync("sleep", ["0.02"])
    expect(existsSync(`/proc/${pid}`)).toBe(false)
  })

  it("launch appends the output to its log and ends at the tool's exit, while its child holds the log", async () => {
    const log = join(dir, "launch.log")
    const code = await launch(
      "/bin/sh",
      ["-c", 'echo "started $GREETING"; sleep 30 & echo "left $!"; exit 4'],
      {
        log,
        env: { PATH: "/usr/bin:/bin", GREETING: "hello" },
      },
    )
    expect(code).toBe(4)
    const text = await readFile(log, "utf8")
    expect(text).toMatch(/^started hello\nleft \d+\n$/)
    // The sleep it left holds the log open; it is this test's to end.
    process.kill(Number(/left (\d+)/.exec(text)?.[1]), "SIGKILL")
    // One that cannot start: no exit code, and the log says why.
    expect(await launch("/nonexistent", [], { log, env: {} })).toBeNull()
    expect((await readFile(log, "utf8")).endsWith("spawn /nonexistent ENOENT\n")).toBe(true)
  })

  it("answers tools whose end it was never signalled (a lost SIGCHLD)", async () => {
    // Started with SIGCHLD blocked (the mask survives exec), the helper is told of no tool's end:
    // it must still reap its tools and answer, in both modes (it watches their pidfds).
    const helper = spawn(
      "perl",
      [
        "-MPOSIX",
        "-e",
        'sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGCHLD)) or die "sigprocmask: $!"; exec @ARGV',
        ...helperInterpreter,
        helperPath,
      ],
      { stdio: ["pipe", "pipe", "inherit"] },
    )
    try {
      let buffer = Buffer.alloc(0)
      const answers = new Map<string, Array<string>>()
      helper.stdout.on("data", (chunk: Buffer) => {
        const { whole, rest } = frames(Buffer.concat([buffer, chunk]))
        buffer = Buffer.from(rest)
        for (const [id, ...fields] of whole) answers.set(String(id), fields.map(String))
      })
      const log = join(dir, "lost.log")
      helper.stdin.write(frame(["1", "", "", "", "/bin/echo", "piped"]))
      helper.stdin.write(frame(["2", log, "", "", "/bin/sh", "-c", "echo logged; exit 3"]))
      // Without a bound on its wait it would wait for ever; 20 s is a hang here.
      const until = Date.now() + 20_000
      while (answers.size < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 20))
      expect(answers.get("1")).toEqual(["exit", "0", "piped\n", ""])
      expect(answers.get("2")).toEqual(["exit", "3", "", ""])
      expect(await readFile(log, "utf8")).toBe("logged\n")
    } finally {
      helper.kill("SIGKILL")
    }
  })

  it("launch with a sealed program: the tool finds a sealed copy on descriptor 3, kept while the file is unchanged, and can run it", async () => {
    const program = join(dir, "echo-copy")
    await copyFile("/bin/echo", program)
    const log = join(dir, "sealed.log")
    // What the tool sees on descriptor 3: its seals, where it points, its inode, its bytes' hash.
    const look = async () => {
      await rm(log, { force: true })
      const code = await launch(
        "/usr/bin/python3",
        [
          "-c",
          "import fcntl, hashlib, os; print(fcntl.fcntl(3, fcntl.F_GET_SEALS), os.readlink('/proc/self/fd/3'), os.fstat(3).st_ino, hashlib.sha256(os.pread(3, 1 << 24, 0)).hexdigest(), sep='|')",
        ],
        { log, env: { PATH: "/usr/bin:/bin" }, sealed: program },
      )
      expect(code).toBe(0)
      const [seals, link, inode, hash] = (await readFile(log, "utf8")).trim().split("|")
      return { seals: Number(seals), link, inode, hash }
    }
    const hashOf = async (file: string) =>
      createHash("sha256")
        .update(await readFile(file))
        .digest("hex")
    const first = await look()
    // Sealed against every change (what crun checks before it skips copying itself).
    // F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE (linux/fcntl.h: 1, 2, 4, 8).
    expect(first.seals).toBe(15)
    expect(first.link).toBe("/memfd:echo-copy (deleted)")
    expect(first.hash).toBe(await hashOf("/bin/echo"))
    // The same copy while the file is unchanged; a new one once it changes.
    expect(await look()).toEqual(first)
    await copyFile("/bin/true", program)
    const changed = await look()
    expect(changed.inode).not.toBe(first.inode)
    expect(changed.hash).toBe(await hashOf("/bin/true"))
    // The tool runs the copy (a program named by its name, found in the PATH, the same way).
    await copyFile("/bin/echo", program)
    await rm(log, { force: true })
    const ran = await launch("sh", ["-c", 'exec /proc/self/fd/3 "ran the copy"'], {
      log,
      env: { PATH: `/usr/bin:/bin:${dir}` },
      sealed: "echo-copy",
    })
    expect(ran).toBe(0)
    expect(await readFile(log, "utf8")).toBe("ran the copy\n")
    // A program that is not there: the tool does not start, and its log says why.
    await rm(log, { force: true })
    const missing = join(dir, "none")
    expect(await launch("sh", ["-c", "exit 0"], { log, env: { PATH: "/bin" }, sealed: missing })).toBeNull()
    expect(await readFile(log, "utf8")).toBe(`spawn sh: ${missing} ENOENT\n`)
  })
})
