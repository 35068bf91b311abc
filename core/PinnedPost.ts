/**
 * One HTTPS POST to an address that was checked (`PublicAddress.resolvePublic`), for the calls
 * Hangar makes to callers' servers: webhooks and custom tools.
 *
 * The connection goes to the checked address whatever the host name resolves to by then (the
 * request's `lookup` is pinned to it, so DNS rebinding cannot switch it), while TLS still checks
 * the certificate against the host name and SNI carries it. No agent (no pooled connection to a
 * host checked earlier), no redirects (a 3xx is just a status), and interruption (a caller's
 * timeout) destroys the request.
 */
import type { LookupAddress } from "node:dns"
import { request } from "node:https"
import { Data, Effect } from "effect"
import type { CheckedAddress } from "./PublicAddress.ts"

/** No usable answer: connection, TLS, a body over the limit, or the response broke off. */
export class PostFailed extends Data.TaggedError("PostFailed")<{ readonly message: string }> {}

/** What came back: the status, and the body as text when it was read. */
export interface PostAnswer {
  readonly status: number
  readonly text: string
}

/**
 * POSTs `body` (JSON) to `url`, connecting to `address` only. With `maxBytes` 0 it answers as soon
 * as the status line arrives and reads no body; otherwise it reads the body, failing past
 * `maxBytes`. `ca`: the trusted certificate authorities (Node's defaults when absent).
 */
export const postPinned = (options: {
  readonly url: URL
  readonly address: CheckedAddress
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
  readonly userAgent: string
  readonly maxBytes: number
  readonly ca?: ReadonlyArray<string> | undefined
}): Effect.Effect<PostAnswer, PostFailed> =>
  Effect.async<PostAnswer, PostFailed>((resume) => {
    const { url, address, maxBytes } = options
    const pinned = (
      _host: string,
      lookup: { all?: boolean },
      callback: (err: NodeJS.ErrnoException | null, found: string | LookupAddress[], family?: number) => void,
    ) => {
      if (lookup.all === true) callback(null, [{ address: address.address, family: address.family }])
      else callback(null, address.address, address.family)
    }
    const req = request({
      protocol: "https:",
      hostname: url.hostname.replace(/^\[(.*)\]$/, "$1"),
      port: url.port === "" ? 443 : Number(url.port),
      path: `${url.pathname}${url.search}`,
      method: "POST",
      headers: {
        ...options.headers,
        "content-type": "application/json",
        "content-length": String(Buffer.byteLength(options.body)),
        "user-agent": options.userAgent,
      },
      // biome-ignore lint/suspicious/noExplicitAny: node's overloaded lookup type.
      lookup: pinned as any,
      agent: false,
      ...(options.ca === undefined ? {} : { ca: [...options.ca] }),
    })
    req.on("response", (res) => {
      const status = res.statusCode ?? 0
      if (maxBytes === 0) {
        resume(Effect.succeed({ status, text: "" }))
        res.destroy()
        return
      }
      const chunks: Array<Buffer> = []
      let size = 0
      res.on("data", (c: Buffer) => {
        size += c.byteLength
        if (size > maxBytes) {
          res.destroy()
          resume(Effect.fail(new PostFailed({ message: `the answer is larger than ${maxBytes} bytes` })))
          return
        }
        chunks.push(c)
      })
      res.on("end", () => resume(Effect.succeed({ status, text: Buffer.concat(chunks).toString("utf8") })))
      res.on("error", (e) => resume(Effect.fail(new PostFailed({ message: e.message }))))
    })
    req.on("error", (e: NodeJS.ErrnoException) =>
      resume(Effect.fail(new PostFailed({ message: e.code ? `${e.code}: ${e.message}` : e.message }))),
    )
    req.end(options.body)
    return Effect.sync(() => req.destroy())
  })
