/**
 * Test helpers for the definitions group: a gateway on port 0 over a real nats-server serving the
 * given routes with the auth step, the account store, and this group's services (an in-memory
 * master key, vendors at the given fake URLs). Collects every log line.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Kvm } from "@nats-io/kv"
import { Effect, Exit, Layer, Scope } from "effect"
import type { AccountRecord } from "../../core/Accounts.ts"
import { makeId } from "../../core/Ids.ts"
import { hashToken, newToken } from "../../core/KeyTokens.ts"
import * as Kv from "../../core/Kv.ts"
import * as Links from "../../core/Links.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as Nats from "../../core/Nats.ts"
import * as Storage from "../../core/Storage.ts"
import { VendorSettings, type VendorSettingsShape } from "../../core/vendors/Vendors.ts"
import type { Key } from "../../schema/Account.ts"
import type { BaseInfo } from "../../schema/Base.ts"
import { HostRecord } from "../../schema/Host.ts"
import type { KeyId } from "../../schema/Ids.ts"
import * as AnthropicFake from "../../test/fakes/AnthropicFake.ts"
import * as GoogleFake from "../../test/fakes/GoogleFake.ts"
import * as OpenAiFake from "../../test/fakes/OpenAiFake.ts"
import { startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { personToken, startGateway as startSharedGateway, type TestGateway } from "../auth/testing.ts"
import type { Route } from "../Router.ts"
import { storeLayer as runStoreLayer } from "../runs/Runs.ts"
import { layer as groupLayer } from "./group.ts"

export type { TestGateway } from "../auth/testing.ts"

/** The shared test gateway with this group's services: an in-memory master key, vendors at `vendors`. */
export const startGateway = (
  // biome-ignore lint/suspicious/noExplicitAny: route groups differ in requirements, all provided here
  routes: ReadonlyArray<Route<any>>,
  options: {
    readonly natsUrl: string
    readonly prefix: string
    readonly keyFile: string
    readonly vendors: Partial<VendorSettingsShape>
  },
): Promise<TestGateway> =>
  startSharedGateway(routes, {
    ...options,
    services: Layer.mergeAll(
      groupLayer.pipe(
        Layer.provide(MasterKey.layerMemory()),
        Layer.provide(VendorSettings.layer({ timeoutMs: 5_000, ...options.vendors })),
      ),
      // The function list shows each function's last run, with its output link.
      runStoreLayer,
      Links.layer.pipe(Layer.provideMerge(Links.LinkSettings.layer({ keyFile: `${options.keyFile}.links` }))),
    ),
  })

/** Everything a definitions test needs: a gateway, the vendor fakes, an account and credentials. */
export interface Fixture {
  readonly gw: TestGateway
  readonly openai: OpenAiFake.OpenAiFake
  readonly anthropic: AnthropicFake.AnthropicFake
  readonly google: GoogleFake.GoogleFake
  readonly account: AccountRecord
  readonly ownerUser: string
  readonly keyFile: string
  /** Headers of the account's owner, an admin key and a run key for every function. */
  readonly owner: Record<string, string>
  readonly admin: Record<string, string>
  readonly runAll: Record<string, string>
  /** A key (token) of the account with the given scope and functions. */
  readonly newKey: (
    scope: "admin" | "run",
    functions?: ReadonlyArray<string>,
  ) => Promise<Record<string, string>>
  /** Puts a host record listing `bases` (names) in KV `hosts`, live for an hour. */
  readonly putHost: (
    id: string,
    bases: ReadonlyArray<string>,
    options?: { readonly stale?: boolean },
  ) => Promise<void>
  readonly deleteHost: (id: string) => Promise<void>
  readonly close: () => Promise<void>
}

/** The vendor key every fake accepts. */
export const vendorKey = "sk-proj-VENDORCANARY0123456789abcdefWXYZ"

/** Starts nats-server, the three vendor fakes and a gateway serving `routes`, with an account. */
export const startFixture = async (
  // biome-ignore lint/suspicious/noExplicitAny: route groups differ in requirements, all provided here
  routes: ReadonlyArray<Route<any>>,
): Promise<Fixture> => {
  const nats = await startNatsServer()
  const dir = await mkdtemp(join(tmpdir(), "hangar-definitions-"))
  const keyFile = join(dir, "issuer.key")
  const fakeScope = Effect.runSync(Scope.make())
  const [openai, anthropic, google] = await Effect.runPromise(
    Effect.all([
      OpenAiFake.make({ keys: [vendorKey], models: ["gpt-5", "gpt-4.1", "o3", "text-embedding-3-small"] }),
      AnthropicFake.make({
        keys: [vendorKey],
        models: [{ id: "claude-sonnet-4-5-20250929", display_name: "Claude Sonnet 4.5" }],
      }),
      GoogleFake.make({
        keys: [vendorKey],
        models: [
          { id: "gemini-2.5-pro", inputTokenLimit: 1_048_576, outputTokenLimit: 65_536, thinking: true },
        ],
      }),
    ]).pipe(Scope.extend(fakeScope)),
  )
  const gw = await startGateway(routes, {
    natsUrl: nats.url,
    prefix: uniquePrefix(),
    keyFile,
    vendors: { openaiBaseUrl: openai.url, anthropicBaseUrl: anthropic.url, googleBaseUrl: google.url },
  })
  const { account, owner } = await gw.run(gw.accounts.createAccount("acme", "owner@example.com"))
  const newKey = async (scope: "admin" | "run", functions: ReadonlyArray<string> = ["*"]) => {
    const token = newToken()
    const key: Key = {
      id: makeId("key") as KeyId,
      account: account.id,
      name: "fixture",
      scope,
      functions: functions as Key["functions"],
      created_at: new Date().toISOString(),
      created_by: owner.user,
    }
    await gw.run(gw.accounts.createKey(key, hashToken(token)))
    return { authorization: `Bearer ${token}` }
  }
  const hosts = (f: (kv: Kv.Kv<HostRecord>) => Effect.Effect<unknown, unknown>) =>
    gw.run(
      Effect.gen(function* () {
        const { names } = yield* Storage.Storage
        yield* f(yield* Kv.make(names.kv.hosts.name, HostRecord))
      }),
    )
  const putHost = (id: string, bases: ReadonlyArray<string>, options: { readonly stale?: boolean } = {}) =>
    hosts((kv) => {
      // Live for an hour (a heartbeat in the future), or 16 s old: past the 15 s staleness.
      const at = new Date(Date.now() + (options.stale ? -16_000 : 3_600_000)).toISOString()
      const record: HostRecord = {
        id: id as HostRecord["id"],
        driver: "namespace",
        vcpus: 14,
        memory_mib: 65_536,
        bases: bases.map((name) => ({
          name: name as BaseInfo["name"],
          sha256: "a".repeat(64),
          bytes: 1_000_000,
        })),
        started_at: at,
        heartbeat_at: at,
        machines: [],
        free_vcpus: 14,
        free_memory_mib: 65_536,
      }
      return kv.put(id, record)
    })
  const deleteHost = (id: string) => hosts((kv) => kv.delete(id))
  return {
    gw,
    openai,
    anthropic,
    google,
    account,
    ownerUser: owner.user,
    keyFile,
    owner: {
      authorization: `Bearer ${await personToken(keyFile, "owner@example.com")}`,
      "service-account": account.id,
    },
    admin: await newKey("admin"),
    runAll: await newKey("run"),
    newKey,
    putHost,
    deleteHost,
    close: async () => {
      await gw.close()
      await Effect.runPromise(Scope.close(fakeScope, Exit.void))
      await nats.stop()
      await rm(dir, { recursive: true, force: true })
    },
  }
}

// biome-ignore lint/suspicious/noExplicitAny: response bodies are inspected loosely
export type Json = any

/** Calls the gateway; answers status, parsed body and raw text. */
export const call = async (
  gw: TestGateway,
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: unknown,
): Promise<{ status: number; body: Json; text: string }> => {
  const res = await fetch(`${gw.url}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  return { status: res.status, body: text === "" ? undefined : JSON.parse(text), text }
}

/** Every value of every KV bucket of the gateway's storage, as text (for looking for secrets in clear). */
export const rawKvText = (gw: TestGateway): Promise<string> =>
  gw.run(
    Effect.gen(function* () {
      const { names } = yield* Storage.Storage
      const { js } = yield* Nats.Nats
      const out: Array<string> = []
      for (const spec of Object.values(names.kv)) {
        const kv = yield* Nats.attempt("open", () => new Kvm(js).open(spec.name))
        const keys = yield* Nats.attempt("keys", async () => {
          const ks: Array<string> = []
          for await (const k of await kv.keys()) ks.push(k)
          return ks
        })
        for (const k of keys) {
          const e = yield* Nats.attempt("get", () => kv.get(k))
          if (e) out.push(`${spec.name} ${k} ${new TextDecoder().decode(e.value)}`)
        }
      }
      return out.join("\n")
    }),
  )
