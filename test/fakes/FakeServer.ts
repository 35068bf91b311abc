/**
 * The scripting core shared by the vendor fakes: a `node:http` server on 127.0.0.1, port 0, that
 * records every request and answers through named routes, with per-test scripting:
 *
 * - `failNext(n, reply)`: the next `n` requests (any route, before the key is checked, as an
 *   outage would) get `reply`;
 * - `delay(ms)`: every later answer waits `ms` first;
 * - `enqueue(route, ...replies)`: a queue of scripted replies per route, used before the route's
 *   own handler (the chat endpoints answer only from their queue);
 * - `requests` / `awaitRequests(n)`: what was received, for assertions and for tests that must
 *   act once a request is in flight (e.g. moving a `TestClock`).
 *
 * A route may `validate` a request before its queue is used, answering what the real vendor
 * answers a malformed request (a 400 in its shape): a client bug then fails a test instead of being
 * answered by a scripted reply. The chat fakes share `FakeUsage` (usage in `Chat.CallUsage` terms,
 * each fake writing it in its vendor's fields) and `SeenChat` (a vendor-neutral view of a chat
 * request, for tests that check what the agent sent whatever the vendor).
 *
 * A reply is JSON, raw text, a server-sent event stream, a dropped connection, or no answer at
 * all (`hang`, until the server closes). Closing the scope closes every connection and the server.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, type Scope } from "effect"

/** One scripted answer. */
export interface Reply {
  /** HTTP status; 200 when absent. */
  readonly status?: number
  /** A JSON body. */
  readonly json?: unknown
  /** A raw body, sent as given (for garbage and non-JSON answers). */
  readonly text?: string
  /** A `text/event-stream` body: each event written as `event:`/`data:` lines. */
  readonly sse?: ReadonlyArray<{ readonly event?: string; readonly data: unknown }>
  /** With `sse`: the connection is dropped after this many events (a stream cut mid-way). */
  readonly cutAfter?: number
  readonly headers?: Readonly<Record<string, string>>
  /** Wait this long before answering. */
  readonly delayMs?: number
  /** Never answer (the request stays open until the client gives up or the server closes). */
  readonly hang?: boolean
  /** Close the connection without an HTTP answer. */
  readonly drop?: boolean
}

/** A request as the fake received it. */
export interface RecordedRequest {
  readonly method: string
  /** Path and query as sent. */
  readonly url: string
  readonly path: string
  readonly query: Readonly<Record<string, string>>
  /** Header names lower-cased. */
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
  /** When it arrived (epoch ms). */
  readonly at: number
}

/** A route: requests whose method and path match are answered by `handle` (or its queue). */
export interface Route {
  readonly name: string
  readonly method: string
  readonly path: RegExp
  /** The answer when the route's queue is empty. */
  readonly handle: (request: RecordedRequest, match: RegExpMatchArray) => Reply
  /** An error reply when the request is malformed (checked before the queue), else `undefined`. */
  readonly validate?: (request: RecordedRequest) => Reply | undefined
  /**
   * The reply as the vendor streams it, when the request asked for a stream: a 2xx JSON answer
   * becomes the vendor's server-sent events (other replies go as they are).
   */
  readonly streamed?: (request: RecordedRequest, reply: Reply) => Reply
}

/**
 * Usage a chat fake reports, in `Chat.CallUsage` terms: `input_tokens` billed at the full rate,
 * apart from cache reads and writes. Each fake writes it in its vendor's fields (OpenAI and Google
 * count cache reads inside their input figure; only Anthropic reports cache writes), so a client
 * reading the reply must answer exactly these numbers. Missing fields are 0.
 */
export interface FakeUsage {
  readonly input_tokens?: number
  readonly cache_read_tokens?: number
  readonly cache_write_tokens?: number
  readonly output_tokens?: number
  readonly web_searches?: number
}

/** A tool call a chat fake answers with; `id` is made up when absent (Google sends none). */
export interface FakeCall {
  readonly name: string
  readonly arguments: Readonly<Record<string, unknown>>
  readonly id?: string
}

/** A tool result as a chat request carried it. */
export interface SeenToolResult {
  /** The call id (OpenAI, Anthropic) or the tool name (Google, which has no ids). */
  readonly id: string
  readonly text: string
  /** Base64 PNGs sent with the result. */
  readonly images: ReadonlyArray<string>
  readonly isError: boolean
}

/** One chat request as the fake received it, vendor-neutral. */
export interface SeenChat {
  /** The parsed JSON body, for vendor-specific checks. */
  readonly body: Record<string, unknown>
  readonly model: string
  /** The system prompt (instructions). */
  readonly system: string
  /** The text of each user message that is not a tool result, in order (the first is the prompt). */
  readonly userTexts: ReadonlyArray<string>
  readonly toolResults: ReadonlyArray<SeenToolResult>
  /** Every base64 PNG in the request (user messages and tool results), in order. */
  readonly images: ReadonlyArray<string>
  /** The names of the function tools offered. */
  readonly tools: ReadonlyArray<string>
  /** Whether the vendor's own web search tool was offered. */
  readonly webSearch: boolean
}

/** `n` or 0. */
export const n0 = (n: number | undefined): number => n ?? 0

/** A request's body as a JSON object (`{}` when it is not one). */
export const jsonBody = (request: RecordedRequest): Record<string, unknown> => {
  try {
    const parsed: unknown = JSON.parse(request.body)
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)
      ? (parsed as Record<string, unknown>)
      : {}
  } catch {
    return {}
  }
}

/** `value` as an array of objects (anything else as empty). */
export const objects = (value: unknown): Array<Record<string, unknown>> =>
  Array.isArray(value)
    ? value.filter((v): v is Record<string, unknown> => typeof v === "object" && v !== null)
    : []

/** How a vendor fake behaves around its routes. */
export interface FakeOptions {
  readonly routes: ReadonlyArray<Route>
  /** An error reply when the request's credentials are wrong, else `undefined`. */
  readonly authorize: (request: RecordedRequest) => Reply | undefined
  /** The reply for a path no route serves, in the vendor's error shape. */
  readonly notFound: (request: RecordedRequest) => Reply
  /** How the vendor ends a line of a server-sent event stream (`\n` unless said; Google `\r\n`). */
  readonly sseLineEnd?: string
}

/** The controls every fake offers. */
export interface FakeControls {
  /** `http://127.0.0.1:<port>`: the base URL to configure the client with. */
  readonly url: string
  /** Every request received so far, in order. */
  readonly requests: ReadonlyArray<RecordedRequest>
  /** The next `n` requests get `reply`, before any key check. */
  readonly failNext: (n: number, reply: Reply) => void
  /** Every later answer waits `ms` first (0 to stop). */
  readonly delay: (ms: number) => void
  /** Appends scripted replies to a route's queue. */
  readonly enqueue: (route: string, ...replies: ReadonlyArray<Reply>) => void
  /** Succeeds once at least `n` requests have been received. */
  readonly awaitRequests: (n: number) => Effect.Effect<void>
}

const headersOf = (req: IncomingMessage): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) out[name.toLowerCase()] = Array.isArray(value) ? value.join(", ") : value
  }
  return out
}

/** Starts a fake server for the scope's lifetime. */
export const start = (options: FakeOptions): Effect.Effect<FakeControls, never, Scope.Scope> =>
  Effect.gen(function* () {
    const requests: Array<RecordedRequest> = []
    const failures: Array<{ left: number; reply: Reply }> = []
    const queues = new Map<string, Array<Reply>>()
    const waiters = new Set<{ n: number; resume: () => void }>()
    const timers = new Set<NodeJS.Timeout>()
    let delayMs = 0

    const choose = (request: RecordedRequest): Reply => {
      const failure = failures[0]
      if (failure) {
        failure.left -= 1
        if (failure.left <= 0) failures.shift()
        return failure.reply
      }
      const refused = options.authorize(request)
      if (refused) return refused
      for (const route of options.routes) {
        const match = request.method === route.method ? request.path.match(route.path) : null
        if (!match) continue
        const invalid = route.validate?.(request)
        if (invalid) return invalid
        const queued = queues.get(route.name)?.shift()
        const reply = queued ?? route.handle(request, match)
        const ok = (reply.status ?? 200) < 300 && reply.json !== undefined
        return ok && route.streamed !== undefined ? route.streamed(request, reply) : reply
      }
      return options.notFound(request)
    }

    const send = (res: ServerResponse, reply: Reply) => {
      if (reply.hang) return
      if (reply.drop) {
        res.socket?.destroy()
        return
      }
      const status = reply.status ?? 200
      if (reply.sse) {
        res.writeHead(status, { "content-type": "text/event-stream", ...reply.headers })
        for (const [i, e] of reply.sse.entries()) {
          if (i === reply.cutAfter) {
            // What was written goes out first; then the connection ends without the rest.
            res.socket?.destroySoon()
            return
          }
          const nl = options.sseLineEnd ?? "\n"
          res.write(`${e.event ? `event: ${e.event}${nl}` : ""}data: ${JSON.stringify(e.data)}${nl}${nl}`)
        }
        res.end()
        return
      }
      const isJson = reply.text === undefined
      const body = isJson ? JSON.stringify(reply.json ?? {}) : (reply.text ?? "")
      res.writeHead(status, {
        "content-type": isJson ? "application/json" : "text/plain",
        ...reply.headers,
      })
      res.end(body)
    }

    const server = createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (chunk: Buffer) => chunks.push(chunk))
      req.on("end", () => {
        const parsed = new URL(req.url ?? "/", "http://fake")
        const request: RecordedRequest = {
          method: req.method ?? "GET",
          url: req.url ?? "/",
          path: parsed.pathname,
          query: Object.fromEntries(parsed.searchParams),
          headers: headersOf(req),
          body: Buffer.concat(chunks).toString("utf8"),
          at: Date.now(),
        }
        requests.push(request)
        for (const waiter of waiters) {
          if (requests.length >= waiter.n) {
            waiters.delete(waiter)
            waiter.resume()
          }
        }
        const reply = choose(request)
        const wait = (reply.delayMs ?? 0) + delayMs
        if (wait <= 0) return send(res, reply)
        const timer = setTimeout(() => {
          timers.delete(timer)
          send(res, reply)
        }, wait)
        timers.add(timer)
      })
    })

    const port = yield* Effect.acquireRelease(
      Effect.async<number>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.succeed((server.address() as AddressInfo).port)))
      }),
      () =>
        Effect.async<void>((resume) => {
          for (const timer of timers) clearTimeout(timer)
          server.closeAllConnections()
          server.close(() => resume(Effect.void))
        }),
    )

    return {
      url: `http://127.0.0.1:${port}`,
      requests,
      failNext: (n, reply) => {
        if (n > 0) failures.push({ left: n, reply })
      },
      delay: (ms) => {
        delayMs = ms
      },
      enqueue: (route, ...replies) => {
        const queue = queues.get(route) ?? []
        queue.push(...replies)
        queues.set(route, queue)
      },
      awaitRequests: (n) =>
        Effect.async<void>((resume) => {
          if (requests.length >= n) return resume(Effect.void)
          const waiter = { n, resume: () => resume(Effect.void) }
          waiters.add(waiter)
          return Effect.sync(() => waiters.delete(waiter))
        }),
    } satisfies FakeControls
  })

/** The page of `items` after `start` (an index), at most `size` long, and whether more follow. */
export const pageOf = <T>(items: ReadonlyArray<T>, start: number, size: number) => {
  const page = items.slice(start, start + size)
  return { page, more: start + size < items.length }
}
