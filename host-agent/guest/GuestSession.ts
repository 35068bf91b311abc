/**
 * GuestSession: the host agent's one SSH connection to a machine, kept open for the machine's
 * life, and the command kinds run over it. The machine's host key is pinned (the driver generated
 * it), Nagle is off (or every exec waits ~40 ms for a delayed ACK), and commands run concurrently,
 * each `bash` on its own channel and the file kinds over one shared SFTP channel.
 *
 * A `bash` command runs in its own `bash -c`, in its own process group, and in its own
 * memory cgroup below the machine's, so an OOM kill is attributed to the command that caused it
 * and cancelling (interrupting the effect) kills every process it started, wherever they went.
 */
import { constants } from "node:os"
import { posix } from "node:path"
import type { Scope } from "effect"
import { Data, Effect } from "effect"
import type { ClientChannel, SFTPWrapper } from "ssh2"
import ssh2 from "ssh2"
import * as Files from "./Files.ts"
import { OutputKeeper } from "./Output.ts"

/** Where and how to reach a machine's sshd. */
export interface GuestEndpoint {
  readonly host: string
  readonly port: number
  /** The public host key to pin, OpenSSH `type base64` line. */
  readonly hostKey: string
  /** The client's private key (OpenSSH text), whose public half the machine authorizes. */
  readonly privateKey: string
}

/** The connection to the machine is lost or could not be made: the command could not run. */
export class GuestUnavailable extends Data.TaggedError("GuestUnavailable")<{ readonly detail: string }> {}

/** The command's arguments break a rule; it did not run. */
export class InvalidArguments extends Data.TaggedError("InvalidArguments")<{
  readonly field: string
  readonly detail: string
}> {}

/** Default `bash` timeout: 5 minutes. */
export const BASH_DEFAULT_TIMEOUT_MS = 5 * 60_000
/** Longest `bash` timeout: 24 hours. */
export const BASH_MAX_TIMEOUT_MS = 24 * 60 * 60_000

export interface BashArgs {
  readonly command: string
  readonly workdir?: string
  readonly timeout_ms?: number
  readonly env?: Readonly<Record<string, string>>
}

export interface BashResult {
  readonly exit_code: number
  readonly output: string
  readonly output_bytes: number
  readonly truncated: boolean
  readonly timed_out: boolean
  readonly oom_killed: boolean
}

export type {
  EditArgs,
  EditResult,
  ListArgs,
  ListResult,
  ReadArgs,
  ReadResult,
  WriteArgs,
  WriteResult,
} from "./Files.ts"

/** The command kinds a machine answers. */
export interface GuestSession {
  /** Runs `command`; output chunks go to `onOutput` as they come. Interrupting cancels it and kills its processes. */
  readonly bash: (
    args: BashArgs,
    onOutput?: (chunk: Uint8Array) => void,
  ) => Effect.Effect<BashResult, GuestUnavailable | InvalidArguments>
  /** Reads lines of a text file, or an image as a data URL. */
  readonly read: (args: Files.ReadArgs) => Effect.Effect<Files.ReadResult, GuestUnavailable>
  /** Writes a file, making its parent folders. */
  readonly write: (args: Files.WriteArgs) => Effect.Effect<Files.WriteResult, GuestUnavailable>
  /** Applies all edits or none, replacing the file atomically. */
  readonly edit: (args: Files.EditArgs) => Effect.Effect<Files.EditResult, GuestUnavailable>
  /** Lists a folder (1,000 entries at most, links skipped). */
  readonly list: (args: Files.ListArgs) => Effect.Effect<Files.ListResult, GuestUnavailable>
  /**
   * A raw exec channel on the session's connection (optionally with a PTY), for the run-level work
   * in `Setup`, `Inputs`, `Outputs`, `Transfer` and `Terminal`; the caller ends or closes it.
   */
  readonly channel: (
    command: string,
    options?: ssh2.ExecOptions,
  ) => Effect.Effect<RawChannel, GuestUnavailable>
}

/** How a raw channel's program ended: its exit code, or 128 + the signal's number when a signal ended it. */
export interface ChannelExit {
  readonly code: number
  readonly signal?: string
}

/** A raw exec channel and its ending (code -1 when the guest sent no status). */
export interface RawChannel {
  readonly channel: ClientChannel
  readonly exit: Promise<ChannelExit>
}

// Listens at once, in the exec callback: a short program's status and close can arrive in the same
// read as the exec's confirmation, before any later listener is attached.
const exitOf = (ch: ClientChannel): Promise<ChannelExit> =>
  new Promise((ok) => {
    let status: ChannelExit = { code: -1 }
    ch.on("exit", (code: number | null, signal?: string) => {
      if (typeof code === "number") status = { code }
      else if (signal) {
        const n = (constants.signals as Record<string, number | undefined>)[`SIG${signal}`] ?? 0
        status = { code: 128 + n, signal }
      }
    })
    ch.on("close", () => ok(status))
  })

// The fixed program every `bash` command runs, after `k=<cgroup slot>`. The rest of its arguments
// come on stdin, NUL-separated (workdir, command, then NAME=value pairs), so nothing is quoted and
// the size is not bounded by sshd's command line. The command's stdout and stderr go to the
// channel's stdout; the wrapper reports on the channel's stderr: `pid N` once the command starts
// (it is in its cgroup by then), and at the end `end <exit code> <oom kills>` after every leftover
// process of the command is killed.
//
// The command's process moves into its cgroup *before* it reads its arguments: moving a process
// between cgroup v1 groups waits for an RCU grace period, 10–20 ms on a quiet host, so the session
// opens the next wrapper ahead of time (`Spare`; the first as the session opens, each next one as
// the command before it is over) and a command only has to write its arguments to one that is
// already waiting. A wrapper that gets no arguments (the session closed) runs nothing.
//
// Only shell builtins run between sshd and the command's bash (each extra program costs ~1.5 ms of
// an exec): `set -m` gives the command its own process group, and command cgroups are reused from
// slots the session hands out (making and removing a memory cgroup costs ~3 ms; a namespace
// machine comes with slots 0 and 1 made, `Cgroups.make`), so the OOM count is the difference of
// the slot's counter over the command.
const WRAPPER = `set -u
cg=/sys/fs/cgroup/memory/p$k
[ -d "$cg" ] || mkdir "$cg" || exit 97
oom0=0; while read -r n v; do [ "$n" = oom_kill ] && oom0=$v; done < "$cg/memory.oom_control"
exec 3>&2 4<&0
set -m
( echo $BASHPID > "$cg/cgroup.procs" && echo 1000 > /proc/self/oom_score_adj || exit 98
IFS= read -r -d '' wd <&4 || exit 0; IFS= read -r -d '' cmd <&4 || exit 0
envs=(); while IFS= read -r -d '' kv <&4; do envs+=("$kv"); done
echo "pid $BASHPID" >&3 && exec 3>&- 4<&- </dev/null && cd "$wd" && for kv in "\${envs[@]}"; do export "$kv"; done && exec /bin/bash -c "$cmd" ) 2>&1 &
exec 4<&-
wait $! 2>/dev/null; rc=$?
oom=0; while read -r n v; do [ "$n" = oom_kill ] && oom=$v; done < "$cg/memory.oom_control"
for ((i = 0; i < 1000; i++)); do mapfile -t ps < "$cg/cgroup.procs"; [ \${#ps[@]} -eq 0 ] && break; kill -9 "\${ps[@]}" 2>/dev/null; sleep 0.005; done
echo "end $rc $((oom - oom0))" >&3
`

// Kills everything in a command cgroup until it is empty.
const killLoop = `for ((i = 0; i < 2000; i++)); do mapfile -t ps < "$cg/cgroup.procs"; [ \${#ps[@]} -eq 0 ] && break; kill -9 "\${ps[@]}" 2>/dev/null; sleep 0.005; done`

// Kills everything in the command's cgroup until it is empty (the slot is not reused before the
// command's channel closes, so nothing else can be in it).
const killCommand = (k: number) => `cg=/sys/fs/cgroup/memory/p${k}; ${killLoop}`

/**
 * Kills every process left in any command slot by an earlier session (a host agent that died with
 * commands running: their processes outlive its connection). Only before the session has opened a
 * wrapper of its own (`connect` with `clearLeftovers`): it would kill that one too, and the first
 * command would run in a wrapper already dead.
 */
const killLeftovers = (guest: GuestSession): Effect.Effect<void, GuestUnavailable> =>
  Effect.flatMap(
    guest.channel(`for cg in /sys/fs/cgroup/memory/p*; do [ -d "$cg" ] || continue; ${killLoop}; done`),
    ({ channel, exit }) =>
      Effect.tryPromise({
        try: () => {
          channel.resume()
          channel.stderr.resume()
          channel.end()
          return exit
        },
        catch: unavailable,
      }),
  ).pipe(
    Effect.flatMap((ended) =>
      ended.code === 0
        ? Effect.void
        : Effect.fail(new GuestUnavailable({ detail: `clearing earlier commands exited ${ended.code}` })),
    ),
  )

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/

const validate = (args: BashArgs): InvalidArguments | undefined => {
  const timeout = args.timeout_ms ?? BASH_DEFAULT_TIMEOUT_MS
  if (!Number.isInteger(timeout) || timeout < 1 || timeout > BASH_MAX_TIMEOUT_MS) {
    return new InvalidArguments({ field: "timeout_ms", detail: `must be 1 to ${BASH_MAX_TIMEOUT_MS}` })
  }
  if (args.command.includes("\0")) return new InvalidArguments({ field: "command", detail: "contains NUL" })
  if (args.workdir?.includes("\0")) return new InvalidArguments({ field: "workdir", detail: "contains NUL" })
  for (const [k, v] of Object.entries(args.env ?? {})) {
    if (!ENV_NAME.test(k)) return new InvalidArguments({ field: `env.${k}`, detail: "not a variable name" })
    if (v.includes("\0")) return new InvalidArguments({ field: `env.${k}`, detail: "contains NUL" })
  }
  return undefined
}

const exec = (client: ssh2.Client, command: string) =>
  new Promise<ClientChannel>((ok, fail) => client.exec(command, (err, ch) => (err ? fail(err) : ok(ch))))

const unavailable = (e: unknown) =>
  new GuestUnavailable({ detail: e instanceof Error ? e.message : String(e) })

/**
 * Has `client` send its ed25519 key's signature in its first publickey request, as RFC 4252 §7
 * allows, instead of first asking whether the key would do (ssh2 always asks). The machine's sshd
 * answers that question and then waits out its delay for a failed attempt (OpenSSH's 5–9 ms per
 * user) before it reads the signed request: asking cost a connect ~7 ms (31.8 against 24.7 ms,
 * median of 8 each, one machine). A key the machine refuses gets the same failure either way. ssh2
 * has no option for it: its protocol object's request is given the signing step when called
 * without one. Its shape is checked first; a connect where it differs keeps ssh2's own way.
 */
const signAtOnce = (client: ssh2.Client): void => {
  const protocol = (client as unknown as { _protocol?: { authPK?: unknown } })._protocol
  const ask = protocol?.authPK
  if (protocol === undefined || typeof ask !== "function") return
  protocol.authPK = (username: string, key: unknown, keyAlgo: unknown, sign: unknown) => {
    const own = key as { type?: unknown; isPrivateKey?: () => boolean; sign?: (data: Buffer) => unknown }
    const signable =
      sign === undefined &&
      own?.type === "ssh-ed25519" &&
      typeof own.sign === "function" &&
      own.isPrivateKey?.() === true &&
      (keyAlgo === undefined || keyAlgo === "ssh-ed25519")
    if (!signable) return ask.call(protocol, username, key, keyAlgo, sign)
    return ask.call(protocol, username, key, keyAlgo, (data: Buffer, done: (signature: Buffer) => void) => {
      const signature = own.sign?.(data)
      // A key that cannot sign is asked about ssh2's way, which reports its failure.
      if (Buffer.isBuffer(signature)) done(signature)
      else ask.call(protocol, username, key, keyAlgo)
    })
  }
}

const connectOnce = (endpoint: GuestEndpoint) =>
  new Promise<ssh2.Client>((ok, fail) => {
    const parsed = ssh2.utils.parseKey(endpoint.hostKey)
    if (parsed instanceof Error) return fail(parsed)
    const pinned = parsed.getPublicSSH()
    // The one method the guest's sshd takes, tried first (not after a `none` attempt to list them).
    const auth: ssh2.PublicKeyAuthMethod = { type: "publickey", username: "root", key: endpoint.privateKey }
    const client = new ssh2.Client()
    // Nagle off from the socket's start: the handshake's small messages would each wait ~40 ms for
    // a delayed ACK (the service request after the key exchange did).
    client.once("connect", () => client.setNoDelay(true))
    // Every error is listened to, for the connection's whole life: the machine's root controls the
    // sshd at the other end, and a garbled packet then a reset gave two errors, the second thrown
    // in the host agent (the process's end). Before `ready` the first fails the connect; after it,
    // the connection's end is what the session goes by (`close`).
    let settled = false
    client.on("error", (e) => {
      if (settled) return
      settled = true
      client.end()
      fail(e)
    })
    client.once("ready", () => {
      settled = true
      ok(client)
    })
    client.connect({
      host: endpoint.host,
      port: endpoint.port,
      username: "root",
      authHandler: [auth],
      hostVerifier: (key: Buffer) => pinned.equals(key),
      readyTimeout: 10_000,
      keepaliveInterval: 15_000,
    })
    signAtOnce(client)
  })

/** A wrapper channel opened ahead of its command, waiting for its arguments on stdin. */
interface Spare {
  readonly channel: ClientChannel
  readonly slot: number
  /** The channel closed (the session ended) before anyone used it. */
  closed: boolean
  /** Taken by a command, which gives the slot back itself (after any kill of the slot ended). */
  taken: boolean
}

/** Opens a wrapper on a slot of `slots`; an unused one gives its slot back when it closes. */
const openWrapper = (client: ssh2.Client, slots: Slots): Promise<Spare> => {
  const slot = slots.take()
  return exec(client, `k=${slot}\n${WRAPPER}`).then(
    (channel) => {
      const spare: Spare = { channel, slot, closed: false, taken: false }
      channel.once("close", () => {
        spare.closed = true
        if (!spare.taken) slots.give(slot)
      })
      return spare
    },
    (e) => {
      slots.give(slot)
      throw e
    },
  )
}

/**
 * The session's wrappers: each command takes the one opened ahead (or opens one when none is
 * ready) and the next is opened right after, so the cgroup move of the next command happens while
 * the machine waits for it.
 */
class Wrappers {
  private spare: Promise<Spare> | undefined
  constructor(
    private readonly client: ssh2.Client,
    private readonly slots: Slots,
  ) {}
  async take(): Promise<Spare> {
    const ready = this.spare
    this.spare = undefined
    const found = ready === undefined ? undefined : await ready.catch(() => undefined)
    const spare = found === undefined || found.closed ? await openWrapper(this.client, this.slots) : found
    spare.taken = true
    return spare
  }
  /**
   * Opens the next wrapper ahead, unless one is open or opening: as the session opens, and as each
   * command is over (`runBash`), not as it starts. Opened beside a command, its sshd fork and two
   * bash starts took the machine's core from that command (an `s` machine has one): `bash true`
   * after 30 ms idle took 17.5–22 ms, against 9.4–10.5 ms with the wrapper opened after the
   * command before it; one right after another takes the same time either way.
   */
  prime(): void {
    if (this.spare !== undefined) return
    this.spare = openWrapper(this.client, this.slots)
    this.spare.catch(() => undefined)
  }
  /**
   * Gives a taken wrapper's slot back once `kill` (a kill loop on the slot, if one ran) is over:
   * a loop still running would kill the next command given the slot.
   */
  give(spare: Spare, kill: Promise<void> | undefined): void {
    void (kill ?? Promise.resolve()).then(() => this.slots.give(spare.slot))
  }
}

/** Cgroup slots of running commands: a slot is reused only after its command's channel closed. */
class Slots {
  private readonly used = new Set<number>()
  take(): number {
    let k = 0
    while (this.used.has(k)) k++
    this.used.add(k)
    return k
  }
  give(k: number): void {
    this.used.delete(k)
  }
}

/**
 * How long a command's kill (at its timeout, or a cancel) waits for the machine: for its loop to
 * empty the command's cgroup (at most 2,000 rounds 5 ms apart) and for the wrapper's channel to
 * close. A machine that answers neither (the tenant stopped its sshd, say) holds neither the
 * command nor the run's end past it.
 */
const KILL_GRACE_MS = 10_000

const runBash = (
  client: ssh2.Client,
  wrappers: Wrappers,
  args: BashArgs,
  onOutput?: (chunk: Uint8Array) => void,
) =>
  Effect.async<BashResult, GuestUnavailable>((resume) => {
    let slot = -1
    let keeper = new OutputKeeper()
    let control = ""
    // Wrappers tried: one that ended before it took the arguments ran nothing, and the command goes
    // to a fresh one (once).
    let tries = 0
    let markStarted: () => void = () => undefined
    // Killing is only sure once the command is inside its cgroup (or already over).
    const started = new Promise<void>((ok) => {
      markStarted = ok
    })
    let finished = false
    let timedOut = false
    let channel: ClientChannel | undefined
    let closed: Promise<void> = Promise.resolve()
    let kill: Promise<void> | undefined
    const killAll = () => {
      kill ??= started
        .then(() => exec(client, killCommand(slot)))
        .then(
          (ch) =>
            new Promise<void>((ok) => {
              ch.on("close", () => ok())
              ch.resume()
              ch.stderr.resume()
            }),
          () => undefined,
        )
      return kill
    }
    // The command's answer, given once.
    let answered = false
    let graceTimer: ReturnType<typeof setTimeout> | undefined
    const settle = (result: Effect.Effect<BashResult, GuestUnavailable>) => {
      if (answered) return
      answered = true
      clearTimeout(graceTimer)
      resume(result)
    }
    const timeoutMs = args.timeout_ms ?? BASH_DEFAULT_TIMEOUT_MS
    const timer = setTimeout(() => {
      timedOut = true
      void killAll()
      graceTimer = setTimeout(() => {
        finished = true
        settle(
          Effect.fail(
            new GuestUnavailable({
              detail: `the command timed out after ${timeoutMs} ms and the machine did not answer its kill within ${KILL_GRACE_MS / 1000} s`,
            }),
          ),
        )
      }, KILL_GRACE_MS)
    }, timeoutMs)
    const begin = (): Promise<void> =>
      wrappers.take().then(onSpare, (e) => {
        markStarted()
        clearTimeout(timer)
        finished = true
        settle(Effect.fail(unavailable(e)))
      })
    const onSpare = (spare: Spare): void => {
      tries++
      const ch = spare.channel
      // Cancelled before a wrapper was ready: it gets no arguments, so it runs nothing.
      if (finished) {
        if (spare.closed) wrappers.give(spare, undefined)
        else ch.once("close", () => wrappers.give(spare, undefined))
        wrappers.prime()
        return void ch.end()
      }
      slot = spare.slot
      channel = ch
      closed = spare.closed ? Promise.resolve() : new Promise((ok) => ch.once("close", () => ok()))
      ch.on("data", (chunk: Buffer) => {
        keeper.push(chunk)
        onOutput?.(chunk)
      })
      ch.stderr.on("data", (chunk: Buffer) => {
        control += chunk.toString("latin1")
        if (/pid \d+\n/.test(control)) markStarted()
      })
      const onClose = () => {
        // No `pid`: the wrapper ended before it took the arguments, so the command never started
        // (its waiting subshell was killed: the OOM killer picks it first, being marked so).
        // Not a result of the command's: it goes to a fresh wrapper.
        if (!finished && kill === undefined && tries < 2 && !/pid \d+\n/.test(control)) {
          wrappers.give(spare, undefined)
          control = ""
          keeper = new OutputKeeper()
          channel = undefined
          void begin()
          return
        }
        markStarted()
        clearTimeout(timer)
        wrappers.give(spare, kill)
        // The command is over: the next one's wrapper is opened now (`Wrappers.prime`).
        wrappers.prime()
        if (finished) return
        finished = true
        const end = /end (\d+) (-?\d+)/.exec(control)
        // A kill loop that ran (timeout) ends first: the command is over when nothing of it is left.
        const answer = (result: Effect.Effect<BashResult, GuestUnavailable>) =>
          kill === undefined ? settle(result) : void kill.then(() => settle(result))
        if (!end)
          return answer(
            Effect.fail(
              new GuestUnavailable({ detail: `bash ended without a status: ${control.slice(-500)}` }),
            ),
          )
        const kept = keeper.result()
        answer(
          Effect.succeed({
            exit_code: Number(end[1]),
            ...kept,
            timed_out: timedOut,
            oom_killed: Number(end[2]) > 0,
          }),
        )
      }
      if (spare.closed) onClose()
      else ch.once("close", onClose)
      const fields = [posix.resolve(Files.WORKSPACE, args.workdir ?? "."), args.command]
      for (const [k, v] of Object.entries(args.env ?? {})) fields.push(`${k}=${v}`)
      ch.end(Buffer.from(fields.map((f) => `${f}\0`).join(""), "utf8"))
    }
    void begin()
    // Cancel: kill every process of the command (its cgroup), then wait for the wrapper to finish,
    // within the grace.
    return Effect.promise(async () => {
      clearTimeout(timer)
      clearTimeout(graceTimer)
      finished = true
      if (!channel) return
      let graceOver: ReturnType<typeof setTimeout> | undefined
      await Promise.race([
        killAll().then(() => closed),
        new Promise((r) => {
          graceOver = setTimeout(r, KILL_GRACE_MS)
        }),
      ])
      clearTimeout(graceOver)
    })
  })

const sftpOf = (client: ssh2.Client) =>
  new Promise<SFTPWrapper>((ok, fail) => client.sftp((err, sftp) => (err ? fail(err) : ok(sftp))))

/**
 * Opens the session (retrying while sshd starts, up to `readyTimeoutMs`); the connection ends with
 * the scope. With `clearLeftovers` (a session taking over a machine an earlier one ran commands
 * on), what those commands left running is killed before the session's first wrapper is opened.
 */
export const connect = (
  endpoint: GuestEndpoint,
  options: { readonly readyTimeoutMs?: number; readonly clearLeftovers?: boolean } = {},
): Effect.Effect<GuestSession, GuestUnavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const client = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const until = Date.now() + (options.readyTimeoutMs ?? 10_000)
          for (;;) {
            try {
              return await connectOnce(endpoint)
            } catch (e) {
              // A key mismatch will not get better by waiting.
              if (Date.now() > until || String(e).includes("verification")) throw e
              await new Promise((r) => setTimeout(r, 20))
            }
          }
        },
        catch: unavailable,
      }),
      (c) => Effect.sync(() => c.end()),
    )
    const wrappers = new Wrappers(client, new Slots())
    // ssh2 never calls back an SFTP request whose connection closed, so every file call races the
    // connection's end: a call pending then, or made later, fails with GuestUnavailable.
    const gone = new Promise<never>((_, fail) => {
      const ended = (what: string) => () => fail(new Error(`the connection to the machine ${what}`))
      client.once("close", ended("closed"))
      client.once("end", ended("ended"))
    })
    gone.catch(() => undefined)
    // The file channel: a call pending when it closes fails, and the next call opens a new one on
    // the same connection, so one bad request (the server closes the channel on some) never
    // leaves a run without file commands.
    let current: { readonly sftp: SFTPWrapper; readonly lost: Promise<never> } | undefined
    let opening: Promise<{ readonly sftp: SFTPWrapper; readonly lost: Promise<never> }> | undefined
    const fileChannel = () => {
      if (current !== undefined) return Promise.resolve(current)
      opening ??= sftpOf(client).then(
        (sftp) => {
          const open = {
            sftp,
            lost: new Promise<never>((_, fail) =>
              sftp.once("close", () => {
                if (current?.sftp === sftp) current = undefined
                fail(new Error("the connection to the machine lost its file channel"))
              }),
            ),
          }
          open.lost.catch(() => undefined)
          current = open
          opening = undefined
          return open
        },
        (e: unknown) => {
          opening = undefined
          throw e
        },
      )
      return opening
    }
    // The first command's wrapper is opened now, not awaited: the first command finds it open or
    // opening. The file channel is opened by the first file call (a file channel that failed to
    // open is opened again by the next one): opened with every session, it cost each machine that
    // never reads a file an SFTP session in its sshd (~12 ms of the machine's CPU a run, one
    // command and no file, `bench/runs.ts`), for ~7 ms on the first file call of a session that
    // does (its open, measured on one machine: first read 10–15 ms against 4–7).
    if (options.clearLeftovers !== true) wrappers.prime()
    // A call sent on a channel that was already closing (the machine closed it for an earlier
    // request) is tried once more on a new one when doing it twice is harmless: read, list, and
    // write (it replaces the whole file). An edit is not tried again.
    const files =
      <A, R>(f: (sftp: SFTPWrapper, args: A) => Promise<R>, idempotent: boolean) =>
      (args: A) =>
        Effect.tryPromise({
          try: async () => {
            const once = async () => {
              const { sftp, lost } = await Promise.race([fileChannel(), gone])
              return await Promise.race([f(sftp, args), lost, gone])
            }
            try {
              return await once()
            } catch (e) {
              // ssh2 answers a request pending on a closing channel "No response from server".
              const channelGone = /lost its file channel|No response from server/.test(String(e))
              if (!idempotent || !channelGone) throw e
              return await once()
            }
          },
          catch: unavailable,
        })
    const session = {
      bash: (args, onOutput) => {
        const invalid = validate(args)
        return invalid ? Effect.fail(invalid) : runBash(client, wrappers, args, onOutput)
      },
      read: files(Files.read, true),
      write: files(Files.write, true),
      edit: files(Files.edit, false),
      list: files(Files.list, true),
      channel: (command, options = {}) =>
        Effect.tryPromise({
          try: () =>
            new Promise<RawChannel>((ok, fail) =>
              client.exec(command, options, (err, ch) =>
                err ? fail(err) : ok({ channel: ch, exit: exitOf(ch) }),
              ),
            ),
          catch: unavailable,
        }),
    } satisfies GuestSession
    if (options.clearLeftovers === true) {
      yield* killLeftovers(session)
      wrappers.prime()
    }
    return session
  })
