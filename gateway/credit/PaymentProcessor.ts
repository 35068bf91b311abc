/**
 * The payment processor (DESIGN.md: Stripe-compatible checkout and signed callback). One service
 * wraps the processor's HTTP API: it makes a hosted checkout session for an amount, and verifies a
 * callback's signature before anything in it is believed.
 *
 * Wire format (Stripe's): `POST {base}/v1/checkout/sessions`, form-encoded, `Authorization: Bearer
 * sk_…`; callbacks carry `Stripe-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of "t.payload" with the
 * webhook secret>` (several `v1` during a secret rotation), refused when `t` is more than 5 minutes
 * from now. With no processor configured (no base URL or no secret key), buying credit answers
 * `503 purchases_closed` and so do callbacks.
 */
import { createHmac, timingSafeEqual } from "node:crypto"
import { Clock, Context, Effect, Layer, Redacted, Schema } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import { ApiError } from "../../schema/Errors.ts"
import { webhookToleranceMs } from "../../schema/Limits.ts"

/** How the processor is reached; empty `baseUrl` or `secretKey` means none is configured. */
export const PaymentSettings = defineSettings(
  "gateway/PaymentSettings",
  {
    /** The processor's API base, e.g. `https://api.stripe.com`. */
    baseUrl: "",
    /** The API secret key (`sk_…`). */
    secretKey: Redacted.make(""),
    /** The secret that signs callbacks (`whsec_…`). */
    webhookSecret: Redacted.make(""),
    /** The console, where the payment page sends the person back. */
    consoleUrl: "http://127.0.0.1:8080",
    /** A callback whose timestamp is further than this from now is refused. */
    toleranceMs: webhookToleranceMs,
    /** How long one call to the processor may take. */
    timeoutMs: 10_000,
  },
  (d) => ({
    baseUrl: env.string("PAYMENTS_BASE_URL", d.baseUrl),
    secretKey: env.redacted("PAYMENTS_SECRET_KEY", ""),
    webhookSecret: env.redacted("PAYMENTS_WEBHOOK_SECRET", ""),
    consoleUrl: env.string("CONSOLE_URL", d.consoleUrl),
  }),
)

/** A checkout session as the processor made it. */
export interface CheckoutSession {
  readonly id: string
  readonly url: string
}

/** The part of a callback event Hangar reads (Stripe's `Event` with a checkout session). */
export const PaymentEvent = Schema.Struct({
  id: Schema.String,
  type: Schema.String,
  created: Schema.Number,
  data: Schema.Struct({
    object: Schema.Struct({
      id: Schema.String,
      amount_total: Schema.optional(Schema.NullOr(Schema.Number)),
      currency: Schema.optional(Schema.NullOr(Schema.String)),
      payment_status: Schema.optional(Schema.String),
      client_reference_id: Schema.optional(Schema.NullOr(Schema.String)),
      metadata: Schema.optional(Schema.NullOr(Schema.Record({ key: Schema.String, value: Schema.String }))),
    }),
  }),
})
export type PaymentEvent = typeof PaymentEvent.Type

/** What the processor offers. */
export interface PaymentProcessorService {
  /** Whether a processor is configured (else both calls fail with `purchases_closed`). */
  readonly open: boolean
  /** A hosted payment page for `amount_usd_cents` credited to `account` (named in the session's metadata). */
  readonly createCheckout: (request: {
    readonly account: string
    readonly amount_usd_cents: number
  }) => Effect.Effect<CheckoutSession, ApiError>
  /** The event in `payload` if `signature` (the `Stripe-Signature` header) verifies; else `invalid_signature`. */
  readonly verifyCallback: (
    payload: Uint8Array,
    signature: string | undefined,
  ) => Effect.Effect<PaymentEvent, ApiError>
}

/** The payment processor. */
export class PaymentProcessor extends Context.Tag("gateway/PaymentProcessor")<
  PaymentProcessor,
  PaymentProcessorService
>() {}

/** The `v1` signature of `payload` at `t` (Unix seconds) with `secret`: hex HMAC-SHA256 of `t.payload`. */
export const sign = (secret: string, t: number, payload: Uint8Array | string): string =>
  createHmac("sha256", secret).update(`${t}.`).update(payload).digest("hex")

/** Parses `t=…,v1=…,v1=…`; other schemes (`v0`) are ignored. */
export const parseSignatureHeader = (
  header: string,
): { t: number; v1: ReadonlyArray<string> } | undefined => {
  let t: number | undefined
  const v1: Array<string> = []
  for (const part of header.split(",")) {
    const eq = part.indexOf("=")
    if (eq < 0) continue
    const k = part.slice(0, eq).trim()
    const v = part.slice(eq + 1).trim()
    if (k === "t" && /^\d{1,12}$/.test(v)) t = Number(v)
    else if (k === "v1" && /^[0-9a-f]{64}$/.test(v)) v1.push(v)
  }
  return t === undefined || v1.length === 0 ? undefined : { t, v1 }
}

const closed = Effect.fail(ApiError.purchasesClosed())

/** Builds the processor from its settings. */
export const make = Effect.gen(function* () {
  const s = yield* PaymentSettings.Tag
  const secretKey = Redacted.value(s.secretKey)
  const webhookSecret = Redacted.value(s.webhookSecret)
  const open = s.baseUrl !== "" && secretKey !== ""
  const base = s.baseUrl.replace(/\/+$/, "")
  const consoleUrl = s.consoleUrl.replace(/\/+$/, "")
  const decodeEvent = Schema.decodeUnknown(Schema.parseJson(PaymentEvent))

  const createCheckout: PaymentProcessorService["createCheckout"] = ({ account, amount_usd_cents }) => {
    if (!open) return closed
    const form = new URLSearchParams({
      mode: "payment",
      "line_items[0][quantity]": "1",
      "line_items[0][price_data][currency]": "usd",
      "line_items[0][price_data][unit_amount]": String(amount_usd_cents),
      "line_items[0][price_data][product_data][name]": "Hangar credit",
      client_reference_id: account,
      "metadata[account]": account,
      "payment_intent_data[metadata][account]": account,
      success_url: `${consoleUrl}/credit?checkout=success`,
      cancel_url: `${consoleUrl}/credit?checkout=cancelled`,
    })
    return Effect.tryPromise({
      try: async (signal) => {
        const res = await fetch(`${base}/v1/checkout/sessions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${secretKey}`,
            "content-type": "application/x-www-form-urlencoded",
          },
          body: form.toString(),
          signal: AbortSignal.any([signal, AbortSignal.timeout(s.timeoutMs)]),
        })
        const text = await res.text()
        if (!res.ok) throw new Error(`processor answered ${res.status}: ${text.slice(0, 300)}`)
        const body = JSON.parse(text) as { id?: unknown; url?: unknown }
        if (typeof body.id !== "string" || typeof body.url !== "string")
          throw new Error("processor's session has no id or url")
        return { id: body.id, url: body.url }
      },
      catch: (e) => e,
    }).pipe(
      Effect.tapError((e) =>
        Effect.logError("checkout session not created").pipe(
          Effect.annotateLogs({ cause: String(e), account }),
        ),
      ),
      Effect.mapError(() => ApiError.internal("the payment processor could not make a checkout; retry")),
      Effect.tap((session) =>
        Effect.logInfo("checkout session created").pipe(
          Effect.annotateLogs({ account, session: session.id, amount_usd_cents }),
        ),
      ),
    )
  }

  const verifyCallback: PaymentProcessorService["verifyCallback"] = (payload, header) =>
    Effect.gen(function* () {
      if (!open || webhookSecret === "") return yield* closed
      const parsed = header === undefined ? undefined : parseSignatureHeader(header)
      if (!parsed)
        return yield* Effect.fail(ApiError.invalidSignature("Stripe-Signature: missing or malformed"))
      const now = yield* Clock.currentTimeMillis
      if (Math.abs(now - parsed.t * 1000) > s.toleranceMs)
        return yield* Effect.fail(ApiError.invalidSignature("Stripe-Signature: timestamp too far from now"))
      const expected = Buffer.from(sign(webhookSecret, parsed.t, payload), "hex")
      if (!parsed.v1.some((v) => timingSafeEqual(Buffer.from(v, "hex"), expected)))
        return yield* Effect.fail(ApiError.invalidSignature())
      return yield* decodeEvent(new TextDecoder().decode(payload)).pipe(
        Effect.mapError(() => ApiError.invalidRequest("body: not a processor event")),
      )
    })

  return { open, createCheckout, verifyCallback } satisfies PaymentProcessorService
})

/** The processor as a layer over its settings. */
export const layer: Layer.Layer<PaymentProcessor, never, typeof PaymentSettings.Tag.Identifier> =
  Layer.effect(PaymentProcessor, make)
