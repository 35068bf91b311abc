/**
 * The CLI's HTTP client: the API address (`SERVICE_API`, default the local `http://127.0.0.1:8080`),
 * the key (`SERVICE_KEY`, else the one `hangar login` saved for that address), JSON in and out, and
 * the spec's error body turned into `ApiRefused`. Creating calls carry an `Idempotency-Key`, so the
 * retries of a `conflict`, an `internal` error, a `rate_limited` answer or a lost connection can
 * never make a second run or command.
 */
import * as Credentials from "./Credentials.ts"
import { ApiRefused, UsageError } from "./Failures.ts"

/** Default API address: the local stack `npm start` runs. */
export const DEFAULT_API = "http://127.0.0.1:8080"

const ATTEMPTS = 4

/** The address as a base URL without a trailing slash (`host:port` gets `http://`). */
export const normalize = (api: string): string => {
  const withScheme = /^[a-z]+:\/\//i.test(api) ? api : `http://${api}`
  let url: URL
  try {
    url = new URL(withScheme)
  } catch {
    throw new UsageError(`SERVICE_API: not an address: ${api}`)
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new UsageError(`SERVICE_API: must be http or https: ${api}`)
  return url.toString().replace(/\/+$/, "")
}

export interface CallOptions {
  /** Query parameters (undefined ones are left out). */
  readonly query?: Readonly<Record<string, string | number | undefined>>
  /** Send no credential (the login routes). */
  readonly anonymous?: boolean
  /** An abort signal (Ctrl-C). */
  readonly signal?: AbortSignal
}

export interface Api {
  /** The API's base URL. */
  readonly base: string
  /** Calls the API; answers the JSON body of a 2xx, else throws `ApiRefused`. */
  readonly call: <T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    options?: CallOptions,
  ) => Promise<T>
  /** The credential's headers (for the upload and download links, which carry their own signature). */
  readonly key: () => string
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Whether a refusal may be tried again as it is (spec "Errors": `conflict`, `internal`; and rate limits). */
const retryable = (status: number, code: string) =>
  code === "conflict" || code === "internal" || code === "rate_limited" || status === 502 || status === 503

/** The client for the environment's address and key. */
export const make = (env: NodeJS.ProcessEnv = process.env): Api => {
  const base = normalize(env.SERVICE_API || DEFAULT_API)
  const key = () => {
    const k = env.SERVICE_KEY || Credentials.load(base, env)?.key
    if (!k)
      throw new ApiRefused(
        401,
        "unauthenticated",
        `no key for ${base}: run \`hangar login\` or set SERVICE_KEY`,
      )
    return k
  }
  const call = async <T>(
    method: string,
    path: string,
    body?: unknown,
    options: CallOptions = {},
  ): Promise<T> => {
    const url = new URL(base + path)
    for (const [k, v] of Object.entries(options.query ?? {}))
      if (v !== undefined) url.searchParams.set(k, String(v))
    const headers: Record<string, string> = { accept: "application/json" }
    if (!options.anonymous) headers.authorization = `Bearer ${key()}`
    if (body !== undefined) headers["content-type"] = "application/json"
    // Web Crypto's, loaded when first used: importing node:crypto took ~10 ms of every start.
    if (method === "POST") headers["idempotency-key"] = globalThis.crypto.randomUUID()
    for (let attempt = 1; ; attempt++) {
      let res: Response
      try {
        res = await fetch(url, {
          method,
          headers,
          ...(body === undefined ? {} : { body: JSON.stringify(body) }),
          ...(options.signal ? { signal: options.signal } : {}),
        })
      } catch (e) {
        if (options.signal?.aborted || attempt >= ATTEMPTS) throw unreachable(base, e)
        await sleep(200 * 2 ** attempt)
        continue
      }
      const text = await res.text()
      let parsed: unknown
      try {
        parsed = text === "" ? {} : JSON.parse(text)
      } catch {
        parsed = undefined
      }
      if (res.ok) {
        if (parsed === undefined)
          throw new Error(`${method} ${path}: the API answered ${res.status} with no JSON`)
        return parsed as T
      }
      const error = parsed as { error?: unknown; code?: unknown } | undefined
      const code = typeof error?.code === "string" ? error.code : `http_${res.status}`
      const detail = typeof error?.error === "string" ? error.error : text.slice(0, 200) || res.statusText
      if (attempt < ATTEMPTS && retryable(res.status, code)) {
        const after = Number(res.headers.get("retry-after"))
        await sleep(Number.isFinite(after) && after > 0 ? Math.min(after, 30) * 1000 : 200 * 2 ** attempt)
        continue
      }
      throw new ApiRefused(res.status, code, detail)
    }
  }
  return { base, call, key }
}

/** A connection that failed, said without the stack trace. */
export const unreachable = (base: string, e: unknown): Error => {
  const cause = (e as { cause?: { code?: string; message?: string } })?.cause
  return new Error(`cannot reach the API at ${base}: ${cause?.code ?? cause?.message ?? String(e)}`)
}
