/**
 * `hangar shell RUN`: the real binary in a real terminal (a detached `tmux` session of a fixed
 * size on a private tmux server), against the real stack (gateway, relay, host agent, a machine).
 * Keys go in with `tmux send-keys`, the screen comes out with `tmux capture-pane`, and the local
 * terminal's mode is read with `stty -F` on the pane's tty. Every wait polls with a deadline.
 */
import { execFileSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { rmSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { bin, configHome, hangar } from "./harness/Cli.ts"
import {
  closeStack,
  command,
  createAccount,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "./harness/Stack.ts"

let stack: Stack
let acct: TestAccount
let fn: string
let run: string
let env: Record<string, string>

/** A tmux server of this file's own, so nothing here touches another tmux. */
const server = `hangar-shell-test-${process.pid}-${randomBytes(4).toString("hex")}`
const sessions: Array<string> = []
/** The server's socket file (tmux leaves it behind when its last session ends). */
let socket: string | undefined
/**
 * A command to that server. It reads no configuration file (nothing of the host's tmux setup
 * changes what a pane does), and a pane whose shell ends stays, dead, with its status and screen
 * (`remain-on-exit`): a pane that ends too soon is told, not only its terminal gone.
 */
const tmux = (...args: Array<string>): string =>
  execFileSync("tmux", ["-f", "/dev/null", "-L", server, ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  })

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Polls `check` every 100 ms until it answers something, or fails after `ms` with `what()`. */
const until = async <T>(check: () => T | undefined, what: () => string, ms = 30_000): Promise<T> => {
  const deadline = Date.now() + ms
  for (;;) {
    const value = check()
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(what())
    await pause(100)
  }
}

/** One `hangar shell` in its own 100x30 pane; the pane stays 30 s after the CLI exits. */
const terminal = (args: ReadonlyArray<string>) => {
  const name = `shell-${sessions.length}-${randomBytes(3).toString("hex")}`
  const vars = Object.entries(env).map(([k, v]) => `${k}=${quote(v)}`)
  const line = `env ${vars.join(" ")} ${quote(process.execPath)} ${quote(bin)} ${args.map(quote).join(" ")}; echo "EXIT=$?"; sleep 30`
  tmux(
    "start-server",
    ";",
    "set-option",
    "-g",
    "remain-on-exit",
    "on",
    ";",
    "new-session",
    "-d",
    "-s",
    name,
    "-x",
    "100",
    "-y",
    "30",
    line,
  )
  sessions.push(name)
  socket ??= tmux("display-message", "-p", "-t", name, "#{socket_path}").trim()
  // The pane's terminal as its shell holds it: the same device whatever this process's /dev/pts.
  const tty = `/proc/${tmux("display-message", "-p", "-t", name, "#{pane_pid}").trim()}/fd/0`
  const screen = () => tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name)
  /** The pane as tmux sees it, and its screen (for a failure's message). */
  const pane = () => {
    try {
      const format =
        "pane #{pane_tty}: shell #{pane_pid}, dead #{pane_dead} (status #{pane_dead_status}, signal #{pane_dead_signal})"
      return `${tmux("list-panes", "-t", name, "-F", format)}${screen()}`
    } catch (e) {
      return `no pane: ${(e as Error).message}`
    }
  }
  const self = {
    name,
    screen,
    /** Waits until the screen matches. */
    see: (pattern: string | RegExp, ms?: number) =>
      until(
        () => {
          const s = screen()
          return (typeof pattern === "string" ? s.includes(pattern) : pattern.test(s)) ? s : undefined
        },
        () => `never saw ${String(pattern)} on the screen:\n${screen()}`,
        ms,
      ),
    /** Types `text` (literally), then Enter unless `enter` is false. */
    type: (text: string, enter = true) => {
      tmux("send-keys", "-t", name, "-l", text)
      if (enter) tmux("send-keys", "-t", name, "Enter")
    },
    keys: (...keys: Array<string>) => tmux("send-keys", "-t", name, ...keys),
    /** The local terminal's settings (`stty -a` of the pane's tty). */
    mode: () => {
      try {
        return execFileSync("stty", ["-a", "-F", tty], {
          encoding: "utf8",
          stdio: ["ignore", "pipe", "pipe"],
        })
      } catch (e) {
        throw new Error(`${(e as Error).message}\n${pane()}`)
      }
    },
    /** Waits until the CLI has the local terminal in raw mode: the session is open. */
    open: () =>
      until(
        () => (/(^|\s)-icanon(\s|$)/.test(self.mode()) ? true : undefined),
        () => `the terminal never went raw:\n${self.mode()}\n${screen()}`,
        60_000,
      ),
    /** The CLI's own process (the pane's shell's child). */
    cliPid: () => {
      const shell = tmux("display-message", "-p", "-t", name, "#{pane_pid}").trim()
      const pid = execFileSync("ps", ["-o", "pid=", "--ppid", shell], { encoding: "utf8" })
        .trim()
        .split(/\s+/)[0]
      if (pid === undefined || pid === "") throw new Error(`no CLI process under ${shell}`)
      return Number(pid)
    },
  }
  return self
}

/** Whether `stty -a` says canonical input with echo (the terminal as a shell leaves it). */
const cooked = (mode: string) => /(^|\s)icanon(\s|$)/.test(mode) && /(^|\s)echo(\s|$)/.test(mode)

beforeAll(async () => {
  execFileSync("tmux", ["-V"])
  stack = await startStack({ relay: true })
  acct = await createAccount(stack)
  fn = (await publish(stack, acct, { timeout_minutes: 30 })).function
  run = (await startRun(stack, acct, fn)).id
  env = {
    SERVICE_API: stack.url,
    SERVICE_KEY: (acct.admin.authorization as string).replace(/^Bearer /, ""),
    XDG_CONFIG_HOME: configHome(),
  }
}, 180_000)

afterAll(async () => {
  for (const name of sessions) {
    try {
      tmux("kill-session", "-t", name)
    } catch {
      // Already gone.
    }
  }
  if (socket !== undefined) rmSync(socket, { force: true })
  if (stack !== undefined && run !== undefined)
    await command(stack, acct, run, "finish", { state: "failed" }).catch(() => undefined)
  await closeStack(stack)
}, 180_000)

describe("hangar shell", () => {
  it("types and sees: 42, the pane's size, a resize, then `exit 5` is the CLI's status and the terminal is cooked again", async () => {
    const t = terminal(["shell", run])
    await t.open()
    t.type("echo $((6*7))")
    await t.see(/^42$/m)
    t.type("stty size")
    await t.see(/^30 100$/m)
    tmux("resize-window", "-t", t.name, "-x", "120", "-y", "40")
    t.type("stty size")
    await t.see(/^40 120$/m)
    t.type("exit 5")
    await t.see(/^EXIT=5$/m)
    expect(cooked(t.mode()), t.mode()).toBe(true)
    // The local terminal echoes what is typed again (nothing reads it: `sleep 30` runs).
    t.type("typed-after-the-session", false)
    await t.see("typed-after-the-session")
  }, 120_000)

  it("Ctrl-C interrupts the remote program, not the CLI", async () => {
    const t = terminal(["shell", run])
    await t.open()
    t.type("echo st$((1))arted; sleep 100")
    await t.see(/^st1arted$/m)
    t.keys("C-c")
    t.type("echo after-$((2+3))")
    // Well before the 100 s of the sleep: it was interrupted.
    await t.see(/^after-5$/m, 20_000)
    expect(t.screen()).not.toContain("EXIT=")
    t.type("exit")
    await t.see(/^EXIT=0$/m)
    expect(cooked(t.mode()), t.mode()).toBe(true)
  }, 120_000)

  it("--json: nothing but {exit_status} on the screen, and the status as the CLI's", async () => {
    const t = terminal(["shell", run, "--json"])
    await t.open()
    t.type("echo never-$((1+1)); exit 7")
    const screen = await t.see(/^EXIT=7$/m)
    const before = screen.slice(0, screen.indexOf("EXIT=7")).trim()
    expect(JSON.parse(before)).toEqual({ exit_status: 7 })
    expect(cooked(t.mode()), t.mode()).toBe(true)
  }, 120_000)

  it.each([
    ["SIGINT", 130],
    ["SIGTERM", 143],
    ["SIGHUP", 129],
  ] as const)(
    "%s to the CLI ends it with %i and leaves the terminal cooked",
    async (signal, status) => {
      const t = terminal(["shell", run])
      await t.open()
      t.type("echo ready-$((3*3))")
      await t.see(/^ready-9$/m)
      process.kill(t.cliPid(), signal)
      await t.see(new RegExp(`EXIT=${status}$`, "m"))
      expect(cooked(t.mode()), t.mode()).toBe(true)
    },
    120_000,
  )

  it("the run ends during the session: the close reason is printed, exit 4; a shell on the ended run is refused run_ended (3)", async () => {
    const ended = (await startRun(stack, acct, fn)).id
    const t = terminal(["shell", ended])
    await t.open()
    t.type("echo up-$((4*4))")
    await t.see(/^up-16$/m)
    await command(stack, acct, ended, "finish", { state: "failed" })
    const screen = await t.see(/^EXIT=4$/m)
    expect(screen).toMatch(/hangar shell: .*the run ended/)
    expect(cooked(t.mode()), t.mode()).toBe(true)
    const refused = await hangar(["shell", ended], { env })
    expect(refused.status, refused.stderr).toBe(3)
    expect(refused.stderr).toContain("run_ended")
  }, 180_000)

  it("a run that does not exist: exit 3 not_found", async () => {
    for (const id of ["run_does_not_exist", "run_00000000000000000000000000"]) {
      const ran = await hangar(["shell", id], { env })
      expect(ran.status, ran.stderr).toBe(3)
      expect(ran.stderr).toContain("not_found")
      expect(ran.stdout).toBe("")
    }
  }, 60_000)
})
