/**
 * The `hangar` CLI for users, as a user runs it: the real binary (`cli/bin.cjs`) as a subprocess
 * against the whole stack over HTTP, with the vendor fake for the provider commands. Every exit
 * status of the spec is met here: 0, 1 (run failed), 2 (wrong command), 3 (API refused), 4
 * (anything else), and `exec`'s own statuses and 125.
 */
import { readFileSync, statSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as OpenAiFake from "./fakes/OpenAiFake.ts"
import { configHome, hangar, type Ran, type RunOptions } from "./harness/Cli.ts"
import {
  call,
  closeStack,
  command,
  createAccount,
  expectStatus,
  type Json,
  publish,
  type Stack,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

const VENDOR_KEY = "sk-proj-CLIVENDORCANARY0123456789abcdefWX"

let stack: Stack
let acct: TestAccount
let key: string
let openai: OpenAiFake.OpenAiFake
const scope = Effect.runSync(Scope.make())

beforeAll(async () => {
  openai = await Effect.runPromise(
    OpenAiFake.make({ keys: [VENDOR_KEY], models: ["gpt-5"] }).pipe(Scope.extend(scope)),
  )
  stack = await startStack({ logFlushMs: 300, settings: { OPENAI_BASE_URL: openai.url } })
  acct = await createAccount(stack)
  key = (acct.admin.authorization ?? "").replace(/^Bearer /, "")
}, 120_000)

afterAll(async () => {
  await closeStack(stack)
  await Effect.runPromise(Scope.close(scope, Exit.void))
}, 120_000)

/** `hangar …` as this account's admin key, unless the options say otherwise. */
const cli = (args: ReadonlyArray<string>, options: RunOptions = {}): Promise<Ran> =>
  hangar(args, {
    ...options,
    env: { SERVICE_API: stack.url, SERVICE_KEY: key, XDG_CONFIG_HOME: configHome(), ...options.env },
  })

/** Expects exit status `status`; answers what ran (the message names both streams on failure). */
const expectExit = (ran: Ran, status: number): Ran => {
  expect(ran.status, `status ${ran.status}\nstdout: ${ran.stdout}\nstderr: ${ran.stderr}`).toBe(status)
  return ran
}

const definitionFile = (name: string, text: string) => {
  const file = join(configHome(), name)
  writeFileSync(file, text)
  return file
}

const fnDefinition = (name: string) => ({
  name,
  system_prompt: "Do the task.",
  provider: "none",
  base: stack.base.name,
  size: "s",
  output_manifest: [{ path: "result.txt" }],
})

describe("the command line itself", () => {
  it("help, version, and a wrong command exits 2 with the usage", async () => {
    const help = expectExit(await cli(["--help"]), 0)
    for (const c of ["login", "publish", "run", "exec", "cp", "shell", "finish", "providers"])
      expect(help.stdout).toContain(c)
    expect(expectExit(await cli(["version"]), 0).stdout.trim()).toMatch(/^\d+\.\d+\.\d+$/)
    expect(JSON.parse(expectExit(await cli(["version", "--json"]), 0).stdout)).toHaveProperty("version")
    expect(expectExit(await cli(["run", "--help"]), 0).stdout).toContain("--prompt TEXT")
    expect(expectExit(await cli([]), 2).stdout).toContain("usage: hangar")
    expect(expectExit(await cli(["frobnicate"]), 2).stderr).toContain("unknown command: frobnicate")
    const badFlag = expectExit(await cli(["runs", "--colour"]), 2)
    expect(badFlag.stderr).toContain("--colour")
    expect(badFlag.stderr).toContain("usage: hangar runs")
    expect(expectExit(await cli(["runs", "--state", "queued"]), 2).stderr).toContain("--state")
    expect(expectExit(await cli(["show"]), 2).stderr).toContain("usage: hangar show RUN")
    expect(expectExit(await cli(["show", "a", "b"]), 2).stderr).toContain("unexpected argument: b")
    // An empty id (`"$RUN"` with RUN unset) is a wrong command, not a request for an empty path.
    expect(expectExit(await cli(["show", ""]), 2).stderr).toContain("argument 1 is empty")
    expect(expectExit(await cli(["exec", "", "--", "true"]), 2).stderr).toContain("argument 1 is empty")
    // An older Node is told at once (the folder upload needs zlib.crc32, from 20.15).
    const old = "v20.14.0"
    const tooOld = expectExit(
      await cli(["version"], {
        env: {
          NODE_OPTIONS: `--import=data:text/javascript,Object.defineProperty(process.versions,'node',{value:'${old.slice(1)}'});Object.defineProperty(process,'version',{value:'${old}'})`,
        },
      }),
      1,
    )
    expect(tooOld.stderr).toContain(`hangar needs Node.js 20.15 or later; this is ${old}`)
    expect(expectExit(await cli(["run", "fn"]), 2).stderr).toContain("--prompt is required")
  })

  it("SERVICE_KEY and SERVICE_API are honoured: no key exits 3, a wrong key 3, no API 4", async () => {
    const noKey = expectExit(await cli(["functions"], { env: { SERVICE_KEY: "" } }), 3)
    expect(noKey.stderr).toContain("unauthenticated")
    const wrong = expectExit(await cli(["functions"], { env: { SERVICE_KEY: `hgr_${"A".repeat(43)}` } }), 3)
    expect(wrong.stderr).toContain("unauthenticated")
    const json = expectExit(
      await cli(["functions", "--json"], { env: { SERVICE_KEY: `hgr_${"A".repeat(43)}` } }),
      3,
    )
    expect(JSON.parse(json.stdout)).toMatchObject({ code: "unauthenticated" })
    const away = expectExit(await cli(["functions"], { env: { SERVICE_API: "127.0.0.1:9" } }), 4)
    expect(away.stderr).toContain("cannot reach the API at http://127.0.0.1:9")
    expect(expectExit(await cli(["functions"], { env: { SERVICE_API: "ftp://x" } }), 2).stderr).toContain(
      "SERVICE_API",
    )
  })
})

describe("functions and providers", () => {
  it("publish creates a function from JSON, its next version from YAML, and names by name only when one has it", async () => {
    const name = "cli-fn"
    const json = definitionFile("fn.json", JSON.stringify(fnDefinition(name)))
    const created = JSON.parse(expectExit(await cli(["publish", json, "--json"]), 0).stdout)
    expect(created).toMatchObject({ version: 1, function: expect.stringMatching(/^fnc_/) })
    const yaml = definitionFile(
      "fn.yaml",
      `name: ${name}\nsystem_prompt: |\n  Do the task,\n  carefully.\nprovider: none\nbase: ${stack.base.name}\nsize: s\noutput_manifest:\n  - path: result.txt\n    description: the answer\n`,
    )
    const next = expectExit(await cli(["publish", yaml]), 0)
    expect(next.stdout).toContain(`published ${name} ${created.function} version 2`)
    const listed = JSON.parse(expectExit(await cli(["functions", "--json"]), 0).stdout)
    const mine = listed.functions.find((f: Json) => f.id === created.function)
    expect(mine).toMatchObject({ name, latest: 2 })
    expect(mine.definition.system_prompt).toBe("Do the task,\ncarefully.\n")
    expect(expectExit(await cli(["functions"]), 0).stdout).toMatch(
      new RegExp(`${created.function}\\s+${name}\\s+2`),
    )

    // The API's refusal: its code and the field, exit 3; nothing published.
    const bad = definitionFile("bad.json", JSON.stringify({ ...fnDefinition(name), output_manifest: [] }))
    const refused = expectExit(await cli(["publish", bad]), 3)
    expect(refused.stderr).toMatch(/invalid_request: output_manifest/)
    expect(
      expectExit(await cli(["publish", definitionFile("x.yaml", "name: [unclosed")]), 2).stderr,
    ).toContain("not valid YAML")
    expect(expectExit(await cli(["publish", "/nonexistent.json"]), 2).stderr).toContain("ENOENT")

    // Two functions of one name: neither publish nor run guesses.
    const twin = await publish(stack, acct, { name: "twin" })
    const twin2 = await publish(stack, acct, { name: "twin" })
    const ambiguous = expectExit(
      await cli(["publish", definitionFile("t.json", JSON.stringify(fnDefinition("twin")))]),
      2,
    )
    expect(ambiguous.stderr).toContain(twin.function)
    expect(ambiguous.stderr).toContain(twin2.function)
    expect(expectExit(await cli(["run", "twin", "--prompt", "x"]), 2).stderr).toContain(twin.function)
    expect(expectExit(await cli(["run", "nobody-has-this", "--prompt", "x"]), 3).stderr).toContain(
      "not_found",
    )
    const after = JSON.parse(expectExit(await cli(["functions", "--json"]), 0).stdout)
    expect(after.functions.find((f: Json) => f.id === created.function).latest).toBe(2)
  })

  it("models and provider take the vendor key on stdin, and it never shows", async () => {
    const models = expectExit(await cli(["models", "openai"], { input: `${VENDOR_KEY}\n` }), 0)
    expect(models.stdout).toContain("gpt-5")
    const made = JSON.parse(
      expectExit(
        await cli(["provider", "main", "--vendor", "openai", "--model", "gpt-5", "--json"], {
          input: VENDOR_KEY,
        }),
        0,
      ).stdout,
    )
    expect(made).toMatchObject({ name: "main", version: 1, model: { compact_at_tokens: 200_000 } })
    const again = expectExit(
      await cli(["provider", "main", "--vendor", "openai", "--model", "gpt-5", "--compact", "90000"], {
        input: VENDOR_KEY,
      }),
      0,
    )
    expect(again.stdout).toContain(`published main ${made.id} version 2`)
    const listed = expectExit(await cli(["providers"]), 0)
    expect(listed.stdout).toMatch(new RegExp(`${made.id}\\s+main\\s+2\\s+openai\\s+gpt-5`))
    const wrongKey = expectExit(
      await cli(["models", "openai"], { input: "sk-proj-WRONG0123456789abcdefghijkl" }),
      3,
    )
    expect(wrongKey.stderr).toContain("invalid_request")
    expect(expectExit(await cli(["models", "openai"]), 2).stderr).toContain("stdin")
    expect(expectExit(await cli(["models", "acme"], { input: VENDOR_KEY }), 2).stderr).toContain("VENDOR")
    expect(
      expectExit(
        await cli(["provider", "p2", "--vendor", "openai", "--model", "gpt-5", "--compact", "many"]),
        2,
      ).stderr,
    ).toContain("--compact")
    for (const ran of [models, again, listed, wrongKey])
      expect(ran.stdout + ran.stderr).not.toContain(VENDOR_KEY)
  })
})

describe("runs", () => {
  let fn: string
  beforeAll(async () => {
    fn = (await publish(stack, acct, { name: "cli-runs", timeout_minutes: 30 })).function
  })

  /** Starts `hangar run` following the run; answers the run id once it is printed, and the process's end. */
  const follow = (args: ReadonlyArray<string>) => {
    let resolveId: (id: string) => void = () => {}
    const id = new Promise<string>((r) => {
      resolveId = r
    })
    let seen = ""
    const ended = cli(["run", fn, "--prompt", "work", ...args], {
      onStderr: (chunk) => {
        seen += chunk
        const m = /(run_[0-9a-z]{26}) started/.exec(seen)
        if (m) resolveId(m[1] as string)
      },
    })
    return { id, ended }
  }

  it("run follows a run to success (exit 0) and to failure (exit 1, with the failure)", async () => {
    const ok = follow([])
    const run = await ok.id
    await command(stack, acct, run, "bash", { command: "echo 42 > /workspace/out/result.txt" })
    await command(stack, acct, run, "finish", { state: "succeeded" })
    const done = expectExit(await ok.ended, 0)
    expect(done.stdout).toMatch(/state\s+succeeded/)
    expect(done.stdout).toMatch(/output\s+1 files/)
    expect(done.stderr).toContain(`${run} running`)
    // The log lines came while it ran, before the summary.
    expect(done.stdout).toMatch(/ready[\s\S]*state\s+succeeded/)

    const bad = follow([])
    const failing = await bad.id
    await command(stack, acct, failing, "finish", { state: "failed", detail: "on purpose" })
    const failed = expectExit(await bad.ended, 1)
    expect(failed.stderr).toContain(`${failing} failed:`)
    expect(failed.stderr).toContain("on purpose")
  })

  it("run --detach, exec with the command's own status, finish, show, runs and logs", async () => {
    const run = expectExit(
      await cli(["run", fn, "--prompt", "p", "--detach", "--ref", "ref-1"]),
      0,
    ).stdout.trim()
    expect(run).toMatch(/^run_[0-9a-z]{26}$/)
    const echoed = expectExit(await cli(["exec", run, "--", "echo", "hi", "there;", "exit", "7"]), 7)
    expect(echoed.stdout).toBe("hi there\n")
    expect(expectExit(await cli(["exec", run, "--", "true"]), 0).stdout).toBe("")
    // Output comes as it is made: the first line is seen while the command still runs.
    let early = ""
    const streamed = await cli(["exec", run, "--", "echo first; sleep 2; echo second"], {
      onStdout: (chunk) => {
        if (early === "") early = chunk
      },
    })
    expect(expectExit(streamed, 0).stdout).toBe("first\nsecond\n")
    expect(early).toBe("first\n")
    const record = JSON.parse(
      expectExit(await cli(["exec", run, "--json", "--", "echo", "x;", "exit", "3"]), 3).stdout,
    )
    expect(record).toMatchObject({
      kind: "bash",
      state: "succeeded",
      result: { exit_code: 3, output: "x\n" },
    })
    expect(expectExit(await cli(["exec", run, "--workdir", "/tmp", "--", "pwd"]), 0).stdout).toBe("/tmp\n")
    expect(expectExit(await cli(["exec", run]), 2).stderr).toContain("missing arguments")
    // After `--` the words are the remote command's: an empty one is not refused.
    expect(expectExit(await cli(["exec", run, "--", "echo", "", "ok"]), 0).stdout).toBe("ok\n")

    // finish: refused while the output misses its manifest (exit 3, the problem named), then accepted.
    const early1 = expectExit(await cli(["finish", run]), 3)
    expect(early1.stderr).toContain("result.txt")
    expectExit(await cli(["exec", run, "--", "echo ok > out/result.txt"]), 0)
    expectExit(await cli(["finish", run]), 0)
    const ended: Json = await waitRun(stack, acct, run)
    expect(ended.state).toBe("succeeded")

    const shown = JSON.parse(expectExit(await cli(["show", run, "--json"]), 0).stdout)
    expect(shown).toMatchObject({ id: run, state: "succeeded", external_reference: "ref-1" })
    const human = expectExit(await cli(["show", run]), 0).stdout
    expect(human).toMatch(/state\s+succeeded/)
    expect(human).toContain("result.txt")
    const listed = JSON.parse(expectExit(await cli(["runs", "--function", "cli-runs", "--json"]), 0).stdout)
    expect(listed.runs.map((r: Json) => r.id)).toContain(run)
    expect(expectExit(await cli(["runs", "--state", "succeeded"]), 0).stdout).toContain(run)
    expect(expectExit(await cli(["runs", "--state", "failed"]), 0).stdout).not.toContain(run)
    const log = expectExit(await cli(["logs", run, "--json"]), 0)
    const lines = log.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l))
    expect(lines.map((l) => l.kind)).toEqual(expect.arrayContaining(["ready", "finish", "end"]))
    expect(expectExit(await cli(["logs", run]), 0).stdout).toMatch(/\d\d:\d\d:\d\d ready/)

    // An ended run refuses commands: exit 3 with the API's code.
    expect(expectExit(await cli(["exec", run, "--", "true"]), 3).stderr).toContain("run_ended")
    expect(expectExit(await cli(["show", "run_00000000000000000000000000"]), 3).stderr).toContain("not_found")
  })

  it("exec exits 125 when its command could not run (the run ended under it); finish --failed; logs --follow ends with the run", async () => {
    const run = expectExit(await cli(["run", fn, "--prompt", "p", "--detach"]), 0).stdout.trim()
    let started = false
    const sleeping = cli(["exec", run, "--", "echo started; sleep 60"], {
      onStdout: (chunk) => {
        if (chunk.includes("started")) started = true
      },
    })
    const following = cli(["logs", run, "--follow", "--json"])
    for (let i = 0; i < 200 && !started; i++) await new Promise((r) => setTimeout(r, 100))
    expect(started).toBe(true)
    expectExit(await cli(["finish", run, "--failed", "stopped by the test"]), 0)
    const cut = expectExit(await sleeping, 125)
    expect(cut.stderr).toContain("cancelled")
    const followed = expectExit(await following, 0)
    const kinds = followed.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).kind)
    expect(kinds[kinds.length - 1]).toBe("end")
    const ended: Json = await waitRun(stack, acct, run)
    expect(ended).toMatchObject({ state: "failed", detail: expect.stringContaining("stopped by the test") })
  })
})

describe("exec and Ctrl-C", () => {
  it("SIGINT cancels the remote command (its processes killed) and exits 130; the run goes on", async () => {
    const fn = (await publish(stack, acct, { name: "cli-sigint" })).function
    const run = expectExit(await cli(["run", fn, "--prompt", "p", "--detach"]), 0).stdout.trim()
    let signalled = false
    const ran = expectExit(
      await cli(["exec", run, "--", "echo sleeping; sleep 300"], {
        onStdout: (chunk, child) => {
          if (!signalled && chunk.includes("sleeping")) {
            signalled = true
            child.kill("SIGINT")
          }
        },
      }),
      130,
    )
    expect(ran.stderr).toContain("cancelled")
    const commands = (await call(stack, "GET", `/v1/runs/${run}/commands`, acct.admin)).body
      .commands as Array<Json>
    const cancelled = commands.find((c) => c.kind === "bash" && c.state === "cancelled")
    expect(cancelled, JSON.stringify(commands)).toBeDefined()
    const left = await command(stack, acct, run, "bash", { command: "pgrep -x sleep | wc -l" })
    expect(left.result.output.trim()).toBe("0")
    await command(stack, acct, run, "finish", { state: "failed" })
  })
})

describe("login", () => {
  it("a person approves the code; the key is saved 0600, used from then on, and never printed", async () => {
    const home = configHome()
    let resolveStart: (v: Json) => void = () => {}
    const startedLogin = new Promise<Json>((r) => {
      resolveStart = r
    })
    const ran = hangar(["login", "--json", "--name", "laptop-1"], {
      env: { SERVICE_API: stack.url, XDG_CONFIG_HOME: home },
      onStdout: (chunk) => {
        const first = chunk.split("\n")[0]
        if (first) resolveStart(JSON.parse(first))
      },
    })
    const login = await startedLogin
    expect(login).toMatchObject({ id: expect.any(String), code: expect.any(String), url: expect.any(String) })
    // A wrong code is refused and the CLI keeps waiting; the right one approves.
    const wrong = await call(stack, "POST", `/v1/cli-logins/${login.id}/approve`, acct.owner, {
      code: "WRONG-0000",
    })
    expect(wrong.status).toBe(400)
    expectStatus(
      await call(stack, "POST", `/v1/cli-logins/${login.id}/approve`, acct.owner, { code: login.code }),
      200,
      "approve",
    )
    const done = expectExit(await ran, 0)
    const file = join(home, "hangar", "credentials.json")
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(statSync(join(home, "hangar")).mode & 0o777).toBe(0o700)
    const saved = JSON.parse(readFileSync(file, "utf8"))[stack.url.replace(/\/+$/, "")]
    expect(saved).toMatchObject({ account: acct.id, name: "laptop-1", key: expect.stringMatching(/^hgr_/) })
    expect(done.stdout + done.stderr).not.toContain(saved.key)
    // The saved key works without SERVICE_KEY, and the key is listed under the machine's name.
    const listed = expectExit(
      await hangar(["functions", "--json"], { env: { SERVICE_API: stack.url, XDG_CONFIG_HOME: home } }),
      0,
    )
    expect(JSON.parse(listed.stdout).functions.length).toBeGreaterThan(0)
    const keys = expectStatus(await call(stack, "GET", "/v1/keys", acct.owner), 200, "keys")
    expect(keys.keys.find((k: Json) => k.id === saved.key_id)).toMatchObject({
      name: "laptop-1",
      scope: "admin",
    })
  })
})
