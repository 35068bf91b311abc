/**
 * `hangar admin …` as an operator runs it: real processes (`node cli/bin.cjs`), a real nats-server,
 * then a gateway accepting the token the command minted.
 */
import { execFile } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { routes } from "../gateway/accounts/routes.ts"
import { startGateway, type TestGateway } from "../gateway/auth/testing.ts"
import { type StartedNatsServer, startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const run = promisify(execFile)
const bin = join(import.meta.dirname, "bin.cjs")

let nats: StartedNatsServer
let dir: string
let env: NodeJS.ProcessEnv
let gateway: TestGateway

const hangar = async (...args: Array<string>) => {
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, "admin", ...args], { env, timeout: 60_000 })
    return { code: 0, stdout, stderr }
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string }
    return { code: err.code, stdout: err.stdout, stderr: err.stderr }
  }
}

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-admin-"))
  const prefix = uniquePrefix()
  const keyFile = join(dir, "issuer.key")
  env = {
    ...process.env,
    HANGAR_NATS_URL: nats.url,
    HANGAR_STORAGE_PREFIX: prefix,
    HANGAR_OIDC_KEY_FILE: keyFile,
    HANGAR_DATA_DIR: dir,
  }
  gateway = await startGateway(routes, { natsUrl: nats.url, prefix, keyFile })
}, 60_000)

afterAll(async () => {
  await gateway?.close()
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("hangar admin", () => {
  it("create-account, token, suspend and reactivate work against the running stack", async () => {
    const created = await hangar("create-account", "--name", "acme", "--owner", "Boss@Example.com")
    expect(created.code).toBe(0)
    const { account, owner } = JSON.parse(created.stdout)
    expect(account).toMatchObject({ name: "acme", state: "active" })
    expect(owner).toMatchObject({ account: account.id, email: "boss@example.com", role: "owner" })

    const minted = await hangar("token", "--email", "boss@example.com")
    expect(minted.code).toBe(0)
    const { token } = JSON.parse(minted.stdout)
    const headers = { authorization: `Bearer ${token}`, "service-account": account.id }
    const me = await fetch(`${gateway.url}/v1/account`, { headers })
    expect(me.status).toBe(200)
    expect(await me.json()).toMatchObject({ id: account.id, role: "owner", state: "active" })

    const suspended = await hangar("suspend", "--account", account.id)
    expect(JSON.parse(suspended.stdout)).toEqual({
      account: { id: account.id, name: "acme", state: "suspended" },
    })
    const refused = await fetch(`${gateway.url}/v1/keys`, {
      method: "POST",
      headers: { ...headers, "content-type": "application/json" },
      body: JSON.stringify({ name: "x", scope: "admin" }),
    })
    expect(refused.status).toBe(403)

    const back = await hangar("reactivate", "--account", account.id)
    expect(JSON.parse(back.stdout).account.state).toBe("active")
  }, 120_000)

  it("wrong usage exits 2; an unknown account exits 4; stdout stays empty", async () => {
    for (const args of [
      ["nope"],
      ["token"],
      ["token", "--email", "not-an-email"],
      ["suspend", "--account", "x"],
      ["suspend", "--account"],
      [
        "suspend",
        "--account",
        "acc_00000000000000000000000000",
        "--account",
        "acc_00000000000000000000000001",
      ],
      ["suspend", "--acount", "acc_00000000000000000000000000"],
      ["suspend", "stray", "--account", "acc_00000000000000000000000000"],
    ]) {
      const r = await hangar(...args)
      expect({ args, code: r.code, stdout: r.stdout }).toEqual({ args, code: 2, stdout: "" })
    }
    const missing = await hangar("suspend", "--account", "acc_00000000000000000000000000")
    expect(missing.code).toBe(4)
    expect(missing.stdout).toBe("")
    expect(missing.stderr).toContain("account not found")
  }, 120_000)
})
