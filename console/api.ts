/**
 * The console's one way to the server: the public API (`/v1`) and the console's session routes,
 * same origin, with the session cookie. Requests that change something carry the session's CSRF
 * token; account-scoped ones name the chosen account in `Service-Account`, as the spec asks of a
 * person. A 401 means the session ended: the app goes back to the sign-in page.
 */

/** A refusal of the API: its status and the spec's `{error, code}`. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message)
  }
}

let csrf = ""
let account = ""
let onSignedOut: () => void = () => {}

/** Sets what every request carries: the CSRF token, the chosen account, what to do on a 401. */
export const configure = (options: {
  readonly csrf?: string
  readonly account?: string
  readonly onSignedOut?: () => void
}) => {
  if (options.csrf !== undefined) csrf = options.csrf
  if (options.account !== undefined) account = options.account
  if (options.onSignedOut !== undefined) onSignedOut = options.onSignedOut
}

/** The account requests are made in. */
export const currentAccount = () => account

// biome-ignore lint/suspicious/noExplicitAny: answers are read loosely, by the fields the page shows
export type Json = any

/** Calls the server; answers the parsed JSON, or throws `ApiFailure`. */
export const api = async (
  method: "GET" | "POST" | "DELETE",
  path: string,
  body?: unknown,
  options: { readonly signal?: AbortSignal; readonly noAccount?: boolean } = {},
): Promise<Json> => {
  const headers: Record<string, string> = { accept: "application/json" }
  if (body !== undefined) headers["content-type"] = "application/json"
  if (method !== "GET") headers["x-csrf-token"] = csrf
  if (account !== "" && options.noAccount !== true) headers["service-account"] = account
  const res = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    ...(options.signal === undefined ? {} : { signal: options.signal }),
  })
  const text = await res.text()
  let parsed: Json
  try {
    parsed = text === "" ? {} : JSON.parse(text)
  } catch {
    parsed = { error: text, code: "internal" }
  }
  if (res.ok) return parsed
  if (res.status === 401) onSignedOut()
  throw new ApiFailure(res.status, String(parsed.code ?? "internal"), String(parsed.error ?? res.statusText))
}

/** What to show for a failure. */
export const describe = (e: unknown): string =>
  e instanceof ApiFailure ? `${e.message} (${e.code})` : e instanceof Error ? e.message : String(e)

/** Whether `e` is an aborted request (a page left while it waited). */
export const aborted = (e: unknown): boolean => e instanceof DOMException && e.name === "AbortError"
