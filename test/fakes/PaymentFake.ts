/**
 * A fake of a Stripe-compatible payment processor: `POST /v1/checkout/sessions` with a
 * form-encoded body and `Authorization: Bearer <secret key>`, answering a checkout session
 * (`{id: "cs_test_…", object, url, amount_total, currency, metadata, client_reference_id,
 * payment_status, status}`) and remembering it; and `complete`, which does what Stripe does when
 * the person pays: signs a `checkout.session.completed` event with the webhook secret
 * (`Stripe-Signature: t=…,v1=…`) and POSTs it to the gateway's callback.
 */
import { createHmac, randomBytes } from "node:crypto"
import { Effect, type Scope } from "effect"
import * as FakeServer from "./FakeServer.ts"

/** A session as the fake made it. */
export interface FakeSession {
  readonly id: string
  readonly object: "checkout.session"
  readonly url: string
  readonly amount_total: number
  readonly currency: string
  readonly mode: string
  readonly client_reference_id: string | null
  readonly metadata: Record<string, string>
  readonly success_url: string
  readonly cancel_url: string
  readonly payment_status: "unpaid" | "paid"
  readonly status: "open" | "complete"
}

/** What a delivered callback got back, and what was sent. */
export interface Delivery {
  readonly status: number
  readonly body: unknown
  readonly payload: string
  readonly signature: string
}

/** The fake and its controls. */
export interface PaymentFake extends FakeServer.FakeControls {
  readonly secretKey: string
  readonly webhookSecret: string
  /** Sessions made so far, by id. */
  readonly sessions: ReadonlyMap<string, FakeSession>
  /** The `Stripe-Signature` header of `payload` at `t` (Unix seconds; now by default) with `secret`. */
  readonly signatureOf: (
    payload: string,
    options?: { readonly t?: number; readonly secret?: string },
  ) => string
  /** The `checkout.session.completed` event of a paid session, as Stripe would send it. */
  readonly completedEvent: (sessionId: string, options?: { readonly eventId?: string }) => string
  /** POSTs `payload` signed (or with the given header) to `callbackUrl`, as Stripe delivers events. */
  readonly deliver: (
    callbackUrl: string,
    payload: string,
    options?: { readonly t?: number; readonly secret?: string; readonly signature?: string },
  ) => Promise<Delivery>
  /** Pays the session: signs its `checkout.session.completed` event and POSTs it to `callbackUrl`. */
  readonly complete: (callbackUrl: string, sessionId: string) => Promise<Delivery>
}

const stripeError = (status: number, message: string): FakeServer.Reply => ({
  status,
  json: { error: { type: "invalid_request_error", message } },
})

/** Starts the fake for the scope's lifetime. */
export const make = (
  options: { readonly secretKey?: string; readonly webhookSecret?: string } = {},
): Effect.Effect<PaymentFake, never, Scope.Scope> =>
  Effect.gen(function* () {
    const secretKey = options.secretKey ?? `sk_test_${randomBytes(12).toString("hex")}`
    const webhookSecret = options.webhookSecret ?? `whsec_${randomBytes(16).toString("hex")}`
    const sessions = new Map<string, FakeSession>()
    let base = ""

    const createSession = (request: FakeServer.RecordedRequest): FakeServer.Reply => {
      if (!(request.headers["content-type"] ?? "").startsWith("application/x-www-form-urlencoded"))
        return stripeError(400, "expected a form-encoded body")
      const form = new URLSearchParams(request.body)
      const amount = Number(form.get("line_items[0][price_data][unit_amount]"))
      const currency = form.get("line_items[0][price_data][currency]") ?? ""
      if (!Number.isSafeInteger(amount) || amount < 50) return stripeError(400, "invalid unit_amount")
      if (form.get("mode") !== "payment") return stripeError(400, "mode must be payment")
      const successUrl = form.get("success_url")
      if (!successUrl) return stripeError(400, "missing success_url")
      const metadata: Record<string, string> = {}
      for (const [k, v] of form) {
        const m = /^metadata\[(.+)\]$/.exec(k)
        if (m) metadata[m[1]!] = v
      }
      const id = `cs_test_${randomBytes(24).toString("base64url")}`
      const session: FakeSession = {
        id,
        object: "checkout.session",
        url: `${base}/c/pay/${id}`,
        amount_total: amount * Number(form.get("line_items[0][quantity]") ?? "1"),
        currency,
        mode: "payment",
        client_reference_id: form.get("client_reference_id"),
        metadata,
        success_url: successUrl,
        cancel_url: form.get("cancel_url") ?? "",
        payment_status: "unpaid",
        status: "open",
      }
      sessions.set(id, session)
      return { json: session }
    }

    const controls = yield* FakeServer.start({
      routes: [
        { name: "sessions", method: "POST", path: /^\/v1\/checkout\/sessions$/, handle: createSession },
      ],
      authorize: (request) =>
        request.headers.authorization === `Bearer ${secretKey}`
          ? undefined
          : stripeError(401, "Invalid API Key provided"),
      notFound: (request) =>
        stripeError(404, `Unrecognized request URL (${request.method}: ${request.path})`),
    })
    base = controls.url

    const signatureOf: PaymentFake["signatureOf"] = (payload, o = {}) => {
      const t = o.t ?? Math.floor(Date.now() / 1000)
      const v1 = createHmac("sha256", o.secret ?? webhookSecret)
        .update(`${t}.${payload}`)
        .digest("hex")
      return `t=${t},v1=${v1}`
    }

    const completedEvent: PaymentFake["completedEvent"] = (sessionId, o = {}) => {
      const session = sessions.get(sessionId)
      if (!session) throw new Error(`no session ${sessionId}`)
      const paid: FakeSession = { ...session, payment_status: "paid", status: "complete" }
      sessions.set(sessionId, paid)
      return JSON.stringify({
        id: o.eventId ?? `evt_test_${randomBytes(12).toString("hex")}`,
        object: "event",
        api_version: "2024-06-20",
        created: Math.floor(Date.now() / 1000),
        livemode: false,
        type: "checkout.session.completed",
        data: { object: paid },
      })
    }

    const deliver: PaymentFake["deliver"] = async (callbackUrl, payload, o = {}) => {
      const signature = o.signature ?? signatureOf(payload, o)
      const res = await fetch(callbackUrl, {
        method: "POST",
        headers: { "content-type": "application/json; charset=utf-8", "stripe-signature": signature },
        body: payload,
      })
      const text = await res.text()
      return { status: res.status, body: text === "" ? undefined : JSON.parse(text), payload, signature }
    }

    return {
      ...controls,
      secretKey,
      webhookSecret,
      sessions,
      signatureOf,
      completedEvent,
      deliver,
      complete: (callbackUrl, sessionId) => deliver(callbackUrl, completedEvent(sessionId)),
    } satisfies PaymentFake
  })
