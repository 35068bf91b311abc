import { createHash } from "node:crypto"
import http from "node:http"
import { Context, Data, Deferred, Effect, Exit, Layer, Schema, Scope, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Log from "../core/Log.ts"
import { ApiError } from "../schema/Errors.ts"
import * as Health from "./Health.ts"
import * as RateLimit from "./RateLimit.ts"
import { bytes, empty, error as errorReply, json, stream } from "./Response.ts"
import type { Route } from "./Router.ts"
import { route, streamRoute } from "./Router.ts"
import * as Server from "./Server.ts"

const MiB = 1024 * 1024
const secret = "secret-detail-7d1f"

class Unmapped extends Data.TaggedError("Unmapped")<{ detail: string }> {}

// Signals the abort test waits on; replaced per test.
let hang = {
  started: Effect.runSync(Deferred.make<void>()),
  interrupted: Effect.runSync(Deferred.make<void>()),
}

// Counts what the big stream route has produced, to compare with what the client has read.
const big = { produced: 0, total: 96 * MiB, chunk: new Uint8Array(64 * 1024).fill(97) }

// Refuses every bearer token but `hgr_good` with 401, in a fiber (`/t/who`) or from memory (`/t/who-now`).
const goodOnly = (authorization: string | undefined) => authorization === "Bearer hgr_good"

const routes: ReadonlyArray<Route<never>> = [
  ...Health.routes,
  route({
    method: "GET",
    path: "/t/who",
    handler: ({ headers }) =>
      goodOnly(headers.authorization)
        ? Effect.succeed(json("good"))
        : Effect.fail(ApiError.unauthenticated()),
  }),
  route({
    method: "GET",
    path: "/t/who-now",
    handler: () => Effect.succeed(json("never")),
    now: ({ headers }) =>
      goodOnly(headers.authorization) ? json("good") : errorReply(ApiError.unauthenticated()),
  }),
  route({
    method: "POST",
    path: "/t/echo",
    body: Schema.Struct({ name: Schema.String, count: Schema.Number }),
    handler: ({ body }) => Effect.succeed(json({ got: body }, { status: 201 })),
  }),
  route({
    method: "POST",
    path: "/t/size",
    body: Schema.Struct({ pad: Schema.String }),
    handler: ({ body }) => Effect.succeed(json({ length: body.pad.length })),
  }),
  route({
    method: "GET",
    path: "/t/items/:id/parts/:pid",
    query: Schema.Struct({ limit: Schema.optional(Schema.NumberFromString) }),
    handler: ({ params, query, headers, requestId }) =>
      Effect.succeed(json({ params, query, agent: headers["x-test"], requestId })),
  }),
  route({ method: "GET", path: "/t/items/special/parts/all", handler: () => Effect.succeed(json("static")) }),
  route({ method: "DELETE", path: "/t/items/:id", handler: () => Effect.succeed(empty()) }),
  route({ method: "PUT", path: "/t/items/:id", handler: () => Effect.succeed(empty()) }),
  route({
    method: "GET",
    path: "/t/throw",
    handler: () =>
      Effect.sync(() => {
        throw new Error(secret)
      }),
  }),
  route({ method: "GET", path: "/t/die", handler: () => Effect.die(new Error(secret)) }),
  route({ method: "GET", path: "/t/fail", handler: () => Effect.fail(new Unmapped({ detail: secret })) }),
  route({ method: "GET", path: "/t/conflict", handler: () => Effect.fail(ApiError.conflict()) }),
  route({
    method: "GET",
    path: "/t/hang",
    handler: () =>
      Deferred.succeed(hang.started, undefined).pipe(
        Effect.zipRight(Effect.never),
        Effect.onInterrupt(() => Deferred.succeed(hang.interrupted, undefined)),
      ),
  }),
  route({
    method: "GET",
    path: "/t/big",
    handler: ({ query }) =>
      Effect.sync(() => {
        big.produced = 0
        const chunks = Stream.repeatEffect(
          Effect.sync(() => {
            big.produced += big.chunk.byteLength
            return big.chunk
          }),
        ).pipe(Stream.take(big.total / big.chunk.byteLength))
        return stream(chunks, query.sized === "no" ? {} : { length: big.total })
      }),
  }),
  route({
    method: "GET",
    path: "/t/chunked",
    handler: () =>
      Effect.succeed(
        stream(Stream.make("a", "bb", "ccc").pipe(Stream.map((s) => new TextEncoder().encode(s))), {
          contentType: "text/plain",
        }),
      ),
  }),
  route({
    method: "GET",
    path: "/t/broken",
    handler: () =>
      Effect.succeed(
        stream(
          Stream.concat(
            Stream.make(new Uint8Array(64 * 1024)),
            Stream.fail(new Unmapped({ detail: secret })),
          ),
          { length: MiB },
        ),
      ),
  }),
  route({
    method: "GET",
    path: "/t/text",
    handler: () => Effect.succeed(bytes("hi", { contentType: "text/plain" })),
  }),
  streamRoute({
    method: "PUT",
    path: "/t/ignore",
    bodyLimit: 64 * MiB,
    // Waits without reading, so more than the high-water mark arrives and the client is paused.
    handler: () => Effect.as(Effect.sleep("100 millis"), json({ ignored: true })),
  }),
  streamRoute({
    method: "PUT",
    path: "/t/upload",
    bodyLimit: 8 * MiB,
    handler: ({ body }) =>
      Effect.gen(function* () {
        const hash = createHash("sha256")
        let length = 0
        // A deliberately slow consumer: the client is paused while chunks wait.
        yield* Stream.runForEach(body, (chunk) =>
          Effect.sync(() => {
            hash.update(chunk)
            length += chunk.byteLength
          }).pipe(Effect.zipRight(Effect.sleep("1 millis"))),
        )
        return json({ length, sha256: hash.digest("hex") })
      }),
  }),
]

interface Running {
  readonly url: string
  readonly lines: Array<string>
  readonly close: () => Promise<void>
}

const start = async (rate: { perSecond: number; burst: number }): Promise<Running> => {
  const lines: Array<string> = []
  const scope = Effect.runSync(Scope.make())
  const layer = Server.layer(routes).pipe(
    Layer.provide(RateLimit.layer),
    Layer.provide(RateLimit.RateLimitSettings.layer(rate)),
    Layer.provide(Server.HttpSettings.layer({ addr: "127.0.0.1:0" })),
  )
  const context = await Effect.runPromise(
    Layer.buildWithScope(layer, scope).pipe(Effect.provide(Log.layerCollect(lines))),
  )
  return {
    url: Context.get(context, Server.Server).url,
    lines,
    close: () => Effect.runPromise(Scope.close(scope, Exit.void)),
  }
}

const post = (url: string, body: string | ReadableStream<Uint8Array>, contentType = "application/json") =>
  fetch(url, {
    method: "POST",
    headers: { "content-type": contentType },
    body,
    ...(typeof body === "string" ? {} : { duplex: "half" }),
  } as RequestInit)

// A chunked body (no content-length) of `total` bytes of JSON: {"pad":"xxx…"}.
const chunkedJson = (total: number): ReadableStream<Uint8Array> => {
  const enc = new TextEncoder()
  const head = enc.encode('{"pad":"')
  const tail = enc.encode('"}')
  let left = total - head.length - tail.length
  let sentHead = false
  return new ReadableStream({
    pull(controller) {
      if (!sentHead) {
        sentHead = true
        controller.enqueue(head)
      } else if (left > 0) {
        const n = Math.min(left, 64 * 1024)
        left -= n
        controller.enqueue(new Uint8Array(n).fill(120))
      } else {
        controller.enqueue(tail)
        controller.close()
      }
    },
  })
}

/**
 * The status of a GET of `path` sent from `localAddress` (Linux answers all of 127/8 on `lo`), with
 * `token` as its bearer token when given.
 */
const statusFrom = (base: string, localAddress: string, path: string, token?: string) =>
  new Promise<number>((resolve, reject) => {
    const url = new URL(`${base}${path}`)
    http
      .get(
        {
          host: url.hostname,
          port: url.port,
          path: url.pathname,
          localAddress,
          agent: false,
          headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
        },
        (res) => {
          res.resume()
          res.on("end", () => resolve(res.statusCode ?? 0))
        },
      )
      .on("error", reject)
  })

// biome-ignore lint/suspicious/noExplicitAny: test bodies are inspected loosely
const jsonOf = (res: Response): Promise<any> => res.json()

const padBody = (total: number) => `{"pad":"${"x".repeat(total - '{"pad":""}'.length)}"}`

let server: Running

beforeAll(async () => {
  server = await start({ perSecond: 1_000_000, burst: 1_000_000 })
})
afterAll(() => server.close())

describe("routing", () => {
  it("GET /v1/health answers ok with a request id", async () => {
    const res = await fetch(`${server.url}/v1/health`)
    expect(res.status).toBe(200)
    expect(await jsonOf(res)).toEqual({ status: "ok" })
    const id = res.headers.get("x-request-id")
    expect(id).toMatch(/^req_[A-Za-z0-9_-]{13,}$/)
    const next = await fetch(`${server.url}/v1/health`)
    expect(next.headers.get("x-request-id")).not.toBe(id)
  })

  it("echoes a sane incoming request id and replaces an insane one", async () => {
    const sane = await fetch(`${server.url}/v1/health`, { headers: { "x-request-id": "lb-1234.abc" } })
    expect(sane.headers.get("x-request-id")).toBe("lb-1234.abc")
    const insane = await fetch(`${server.url}/v1/health`, { headers: { "x-request-id": "a b\tc{}" } })
    expect(insane.headers.get("x-request-id")).toMatch(/^req_/)
  })

  it("unknown path is 404 not_found", async () => {
    for (const path of ["/v1/nope", "/v1/health/", "/", "/t/items/1/parts"]) {
      const res = await fetch(`${server.url}${path}`)
      expect(res.status).toBe(404)
      expect(await jsonOf(res)).toEqual({ error: "route not found", code: "not_found" })
      expect(res.headers.get("x-request-id")).toMatch(/^req_/)
    }
  })

  it("known path with another method is 405 with Allow", async () => {
    const res = await fetch(`${server.url}/v1/health`, { method: "POST" })
    expect(res.status).toBe(405)
    expect(res.headers.get("allow")).toBe("GET")
    expect((await jsonOf(res)).code).toBe("method_not_allowed")
    const items = await fetch(`${server.url}/t/items/x`, { method: "PATCH" })
    expect(items.status).toBe(405)
    expect(items.headers.get("allow")).toBe("DELETE, PUT")
  })

  it("path params are decoded, literal segments win, and the query is decoded with its schema", async () => {
    const res = await fetch(`${server.url}/t/items/run%20a/parts/cmd_1?limit=5`, {
      headers: { "x-test": "yes" },
    })
    expect(res.status).toBe(200)
    const got = await jsonOf(res)
    expect(got).toMatchObject({ params: { id: "run a", pid: "cmd_1" }, query: { limit: 5 }, agent: "yes" })
    expect(got.requestId).toBe(res.headers.get("x-request-id"))
    const literal = await fetch(`${server.url}/t/items/special/parts/all`)
    expect(await jsonOf(literal)).toBe("static")
  })

  it("a query failing its schema is 400 invalid_request naming the parameter", async () => {
    const res = await fetch(`${server.url}/t/items/a/parts/b?limit=many`)
    expect(res.status).toBe(400)
    const body = await jsonOf(res)
    expect(body.code).toBe("invalid_request")
    expect(body.error).toMatch(/^query limit: /)
  })

  it("empty, plain-bytes and chunked replies", async () => {
    const del = await fetch(`${server.url}/t/items/x`, { method: "DELETE" })
    expect(del.status).toBe(204)
    expect(await del.text()).toBe("")
    const text = await fetch(`${server.url}/t/text`)
    expect(text.headers.get("content-type")).toBe("text/plain")
    expect(await text.text()).toBe("hi")
    const chunked = await fetch(`${server.url}/t/chunked`)
    expect(chunked.headers.get("transfer-encoding")).toBe("chunked")
    expect(await chunked.text()).toBe("abbccc")
  })
})

describe("JSON bodies", () => {
  it("decodes a valid body", async () => {
    const res = await post(`${server.url}/t/echo`, JSON.stringify({ name: "a", count: 2 }))
    expect(res.status).toBe(201)
    expect(await jsonOf(res)).toEqual({ got: { name: "a", count: 2 } })
  })

  it("content type must be application/json (parameters allowed): 400 naming content-type", async () => {
    const ok = await post(`${server.url}/t/echo`, '{"name":"a","count":1}', "application/json; charset=utf-8")
    expect(ok.status).toBe(201)
    const res = await post(`${server.url}/t/echo`, '{"name":"a","count":1}', "text/plain")
    expect(res.status).toBe(400)
    expect(await jsonOf(res)).toEqual({
      code: "invalid_request",
      error: "content-type: must be application/json",
    })
  })

  it("invalid JSON is 400 invalid_request", async () => {
    const res = await post(`${server.url}/t/echo`, '{"name": "a",')
    expect(res.status).toBe(400)
    expect(await jsonOf(res)).toEqual({ code: "invalid_request", error: "body: not valid JSON" })
  })

  it("a schema failure names the field", async () => {
    const res = await post(`${server.url}/t/echo`, JSON.stringify({ name: "a", count: "two" }))
    expect(res.status).toBe(400)
    const body = await jsonOf(res)
    expect(body.code).toBe("invalid_request")
    expect(body.error).toMatch(/^count: /)
    const missing = await post(`${server.url}/t/echo`, JSON.stringify({ count: 1 }))
    expect((await jsonOf(missing)).error).toBe("name: is required")
  })

  it("exactly 1 MiB is accepted; one byte more is 413 from content-length", async () => {
    const at = await post(`${server.url}/t/size`, padBody(MiB))
    expect(at.status).toBe(200)
    expect(await jsonOf(at)).toEqual({ length: MiB - 10 })
    const over = await post(`${server.url}/t/size`, padBody(MiB + 1))
    expect(over.status).toBe(413)
    expect(await jsonOf(over)).toEqual({ code: "payload_too_large", error: `request body over ${MiB} bytes` })
  })

  it("a chunked body (no content-length) is limited while streaming", async () => {
    const at = await post(`${server.url}/t/size`, chunkedJson(MiB))
    expect(at.status).toBe(200)
    expect(await jsonOf(at)).toEqual({ length: MiB - 10 })
    const over = await post(`${server.url}/t/size`, chunkedJson(MiB + 1))
    expect(over.status).toBe(413)
    expect((await jsonOf(over)).code).toBe("payload_too_large")
    const far = await post(`${server.url}/t/size`, chunkedJson(4 * MiB))
    expect(far.status).toBe(413)
  })
})

describe("streaming bodies", () => {
  it("an upload streams through a slow consumer intact", async () => {
    const data = new Uint8Array(6 * MiB)
    for (let i = 0; i < data.length; i++) data[i] = (i * 31) & 255
    const res = await fetch(`${server.url}/t/upload`, { method: "PUT", body: data })
    expect(res.status).toBe(200)
    expect(await jsonOf(res)).toEqual({
      length: data.length,
      sha256: createHash("sha256").update(data).digest("hex"),
    })
  })

  it("a body the handler does not read is drained, and the connection serves the next request", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    const request = (method: string, path: string, body?: Uint8Array) =>
      new Promise<{ status: number; text: string }>((resolve, reject) => {
        const req = http.request(`${server.url}${path}`, { method, agent }, (res) => {
          let text = ""
          res.on("data", (d: Buffer) => {
            text += d.toString()
          })
          res.on("end", () => resolve({ status: res.statusCode ?? 0, text }))
        })
        req.on("error", reject)
        req.end(body)
      })
    const first = await request("PUT", "/t/ignore", new Uint8Array(16 * MiB))
    expect(first).toEqual({ status: 200, text: '{"ignored":true}' })
    const second = await request("GET", "/v1/health")
    expect(second).toEqual({ status: 200, text: '{"status":"ok"}' })
    agent.destroy()
  })

  it("an upload over its limit is 413, from content-length and while streaming", async () => {
    const over = await fetch(`${server.url}/t/upload`, { method: "PUT", body: new Uint8Array(8 * MiB + 1) })
    expect(over.status).toBe(413)
    const streamed = await fetch(`${server.url}/t/upload`, {
      method: "PUT",
      body: chunkedJson(9 * MiB),
      duplex: "half",
    } as RequestInit)
    expect(streamed.status).toBe(413)
    expect((await jsonOf(streamed)).code).toBe("payload_too_large")
  })

  it.each([
    ["with content-length", "yes"],
    ["chunked", "no"],
  ])("a large response (%s) to a slow reader is produced only as fast as it is read", async (_, sized) => {
    let received = 0
    let ahead = 0
    const status = await new Promise<number>((resolve, reject) => {
      http
        .get(`${server.url}/t/big?sized=${sized}`, (res) => {
          if (sized === "yes") expect(res.headers["content-length"]).toBe(String(big.total))
          else expect(res.headers["transfer-encoding"]).toBe("chunked")
          let sincePause = 0
          res.on("data", (chunk: Buffer) => {
            received += chunk.length
            sincePause += chunk.length
            ahead = Math.max(ahead, big.produced - received)
            if (sincePause >= 4 * MiB) {
              sincePause = 0
              res.pause()
              setTimeout(() => res.resume(), 20)
            }
          })
          res.on("end", () => resolve(res.statusCode ?? 0))
          res.on("error", reject)
        })
        .on("error", reject)
    })
    expect(status).toBe(200)
    expect(received).toBe(big.total)
    expect(big.produced).toBe(big.total)
    // Socket buffers on both sides hold a few MiB; without backpressure the whole 96 MiB would be ahead.
    expect(ahead).toBeLessThan(24 * MiB)
  })
})

describe("failures", () => {
  it.each(["/t/throw", "/t/die", "/t/fail"])(
    "%s becomes 500 internal with no detail, logged with the id",
    async (path) => {
      const res = await fetch(`${server.url}${path}`)
      expect(res.status).toBe(500)
      const text = await res.text()
      expect(JSON.parse(text)).toEqual({ code: "internal", error: "internal error; retry" })
      expect(text).not.toContain(secret)
      const id = res.headers.get("x-request-id")!
      const logged = server.lines.map((l) => JSON.parse(l)).filter((l) => l.request_id === id)
      // The log names what failed (a defect's message, or a failure's tag) under the request id.
      const named = path === "/t/fail" ? "Unmapped" : secret
      expect(logged.some((l) => l.level === "error" && String(l.cause).includes(named))).toBe(true)
      expect(logged.filter((l) => l.msg === "request")).toEqual([
        expect.objectContaining({ status: 500, route: path, method: "GET" }),
      ])
    },
  )

  it("a stream failing after the status has left closes the connection and is logged", async () => {
    const res = await fetch(`${server.url}/t/broken`)
    expect(res.status).toBe(200)
    await expect(res.arrayBuffer()).rejects.toThrow()
    const id = res.headers.get("x-request-id")!
    const logged = server.lines.map((l) => JSON.parse(l)).filter((l) => l.request_id === id)
    expect(
      logged.some((l) => l.msg === "response stream failed" && String(l.cause).includes("Unmapped")),
    ).toBe(true)
  })

  it("an ApiError leaves with its own code and status", async () => {
    const res = await fetch(`${server.url}/t/conflict`)
    expect(res.status).toBe(409)
    expect((await jsonOf(res)).code).toBe("conflict")
  })

  it("a client abort interrupts the handler's fiber", async () => {
    hang = {
      started: Effect.runSync(Deferred.make<void>()),
      interrupted: Effect.runSync(Deferred.make<void>()),
    }
    const controller = new AbortController()
    const pending = fetch(`${server.url}/t/hang`, { signal: controller.signal })
    await Effect.runPromise(Deferred.await(hang.started))
    controller.abort()
    await expect(pending).rejects.toThrow()
    await Effect.runPromise(Deferred.await(hang.interrupted))
    expect(await Effect.runPromise(Deferred.isDone(hang.interrupted))).toBe(true)
  })
})

describe("access log", () => {
  it("one line per request with method, route pattern, status, duration, id and bytes; no secrets", async () => {
    const token = "hgr_supersecret_token_value"
    const res = await fetch(`${server.url}/t/items/a/parts/b`, {
      headers: { authorization: `Bearer ${token}`, "x-request-id": "access-1" },
    })
    await res.text()
    const body = await post(`${server.url}/t/echo`, JSON.stringify({ name: "body-canary", count: 1 }))
    await body.text()
    const mine = server.lines.filter((l) => l.includes('"access-1"'))
    expect(mine).toHaveLength(1)
    const entry = JSON.parse(mine[0]!)
    expect(entry).toMatchObject({
      msg: "request",
      method: "GET",
      route: "/t/items/:id/parts/:pid",
      status: 200,
      request_id: "access-1",
    })
    expect(entry.bytes).toBeGreaterThan(0)
    expect(typeof entry.ms).toBe("number")
    const all = server.lines.join("\n")
    expect(all).not.toContain(token)
    expect(all).not.toContain("body-canary")
  })
})

describe("lifecycle", () => {
  it("closing the layer closes the listen socket", async () => {
    const own = await start({ perSecond: 1_000_000, burst: 1_000_000 })
    expect((await fetch(`${own.url}/v1/health`, { headers: { connection: "close" } })).status).toBe(200)
    await own.close()
    await expect(fetch(`${own.url}/v1/health`)).rejects.toThrow()
  })

  it("closing the layer also ends kept-alive connections", async () => {
    const own = await start({ perSecond: 1_000_000, burst: 1_000_000 })
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    const status = await new Promise<number>((resolve, reject) =>
      http
        .get(`${own.url}/v1/health`, { agent }, (res) => {
          res.resume()
          res.on("end", () => resolve(res.statusCode ?? 0))
        })
        .on("error", reject),
    )
    expect(status).toBe(200)
    const [socket] = Object.values(agent.freeSockets).flat()
    expect(socket).toBeDefined()
    const ended = new Promise<void>((resolve) => socket!.once("close", () => resolve()))
    await own.close()
    await ended
    expect(socket!.destroyed).toBe(true)
    agent.destroy()
  })

  it("a port 0 setting binds a free port and reports it", async () => {
    expect(new URL(server.url).port).toMatch(/^[1-9][0-9]*$/)
    expect(Server.parseAddr("127.0.0.1:0")).toEqual({ host: "127.0.0.1", port: 0 })
    expect(Server.parseAddr("[::1]:8080")).toEqual({ host: "::1", port: 8080 })
    expect(() => Server.parseAddr("localhost")).toThrow(/HANGAR_HTTP_ADDR/)
  })
})

describe("rate limits", () => {
  let limited: Running
  beforeAll(async () => {
    limited = await start({ perSecond: 0.01, burst: 3 })
  })
  afterAll(() => limited.close())

  it("the burst passes, one more is 429 rate_limited with Retry-After; credentials have their own bucket", async () => {
    const url = `${limited.url}/t/items/a/parts/b`
    for (let i = 0; i < 3; i++) expect((await fetch(url)).status).toBe(200)
    const over = await fetch(url)
    expect(over.status).toBe(429)
    expect(await jsonOf(over)).toEqual({ code: "rate_limited", error: "too many requests; retry later" })
    expect(Number(over.headers.get("retry-after"))).toBe(100)
    // Its access line names the route it was refused.
    const refused = limited.lines
      .map((l) => JSON.parse(l))
      .filter((l) => l.msg === "request" && l.status === 429)
    expect(refused).toEqual([expect.objectContaining({ method: "GET", route: "/t/items/:id/parts/:pid" })])
    // A path without a route takes from the same bucket: refused before it is looked up.
    expect((await fetch(`${limited.url}/v1/nope`)).status).toBe(429)
    const keyed = { headers: { authorization: "Bearer hgr_a" } }
    for (let i = 0; i < 3; i++) expect((await fetch(url, keyed)).status).toBe(200)
    expect((await fetch(url, keyed)).status).toBe(429)
    expect((await fetch(url, { headers: { authorization: "Bearer hgr_b" } })).status).toBe(200)
  })

  it("without a token, each client address has its own bucket", async () => {
    const own = await start({ perSecond: 0.01, burst: 2 })
    try {
      const items = (address: string) => statusFrom(own.url, address, "/t/items/a/parts/b")
      for (let i = 0; i < 2; i++) expect(await items("127.0.0.1")).toBe(200)
      expect(await items("127.0.0.1")).toBe(429)
      for (let i = 0; i < 2; i++) expect(await items("127.0.0.2")).toBe(200)
      expect(await items("127.0.0.2")).toBe(429)
    } finally {
      await own.close()
    }
  })

  it("refused tokens count against their address: made-up tokens get the burst of tries, then 429 for any token", async () => {
    const own = await start({ perSecond: 0.01, burst: 3 })
    const from = (address: string, path: string, token?: string) => statusFrom(own.url, address, path, token)
    try {
      // Each made-up token is a credential of its own, with a full bucket: refused 401 three times,
      // by a handler and from memory, then the address is out of tries.
      expect(await from("127.0.0.3", "/t/who", "hgr_madeup1")).toBe(401)
      expect(await from("127.0.0.3", "/t/who-now", "hgr_madeup2")).toBe(401)
      expect(await from("127.0.0.3", "/t/who", "hgr_madeup3")).toBe(401)
      expect(await from("127.0.0.3", "/t/who", "hgr_madeup4")).toBe(429)
      expect(await from("127.0.0.3", "/t/who-now", "hgr_good")).toBe(429)
      // Another address is not held back; nor a token that is let in.
      expect(await from("127.0.0.4", "/t/who", "hgr_madeup5")).toBe(401)
      for (let i = 0; i < 3; i++) expect(await from("127.0.0.4", "/t/who", "hgr_good")).toBe(200)
      expect(await from("127.0.0.4", "/t/who-now", "hgr_madeup6")).toBe(401)
      // A request without a token takes from its address's own bucket, as before.
      expect(await from("127.0.0.3", "/t/items/a/parts/b")).toBe(200)
    } finally {
      await own.close()
    }
  })

  it("health is never refused: a load balancer's probes share their address with the traffic it forwards", async () => {
    const own = await start({ perSecond: 0.01, burst: 2 })
    const health = async () => {
      const res = await fetch(`${own.url}/v1/health`)
      expect(res.status).toBe(200)
      expect(await jsonOf(res)).toEqual({ status: "ok" })
    }
    try {
      // Past the burst, and taking no token: the address's two are still there for other routes.
      for (let i = 0; i < 5; i++) await health()
      for (let i = 0; i < 2; i++) expect((await fetch(`${own.url}/t/items/a/parts/b`)).status).toBe(200)
      expect((await fetch(`${own.url}/t/items/a/parts/b`)).status).toBe(429)
      // And with the address's bucket empty.
      for (let i = 0; i < 5; i++) await health()
    } finally {
      await own.close()
    }
  })
})
