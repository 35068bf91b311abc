/**
 * Buying credit: `POST /v1/credit/checkout` (owners) answers a payment page for $5 to $500, and
 * `POST /v1/credit/callback` (anyone; the processor calls it) turns a verified, paid
 * `checkout.session.completed` (or `checkout.session.async_payment_succeeded`) event into one
 * `purchase` on the account actor.
 *
 * The callback reads its body as raw bytes (the signature covers the exact bytes sent). The ledger
 * entry id is derived from the checkout session id, so the processor's retries, a duplicate
 * delivery, and both "completed" and "async succeeded" of one session credit once: the mailbox's
 * `Nats-Msg-Id` drops a repeat within its window and the actor's applied ids drop it after that.
 */
import { createHash } from "node:crypto"
import { Chunk, Effect, Option, Schema, Stream } from "effect"
import { Accounts } from "../../core/Accounts.ts"
import { Mailbox } from "../../core/actors/Mailbox.ts"
import { CheckoutRequest, CheckoutResponse } from "../../schema/Account.ts"
import { Account } from "../../schema/actors/Account.ts"
import { timestamp } from "../../schema/Common.ts"
import { ApiError } from "../../schema/Errors.ts"
import { AccountId, type LedgerEntryId } from "../../schema/Ids.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"
import { streamRoute } from "../Router.ts"
import { type PaymentEvent, PaymentProcessor } from "./PaymentProcessor.ts"

/** Processor events are small; Stripe's are far under this. */
export const callbackBodyLimit = 256 * 1024

/** Nanodollars per cent. */
const nanosPerCent = 10_000_000

const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

/** The ledger entry id of a purchase: `led_` and 26 base32 characters of the SHA-256 of the session id. */
export const purchaseEntryId = (sessionId: string): LedgerEntryId => {
  const digest = createHash("sha256").update(`checkout:${sessionId}`).digest()
  let bits = 0n
  for (const byte of digest.subarray(0, 17)) bits = (bits << 8n) | BigInt(byte)
  let body = ""
  for (let i = 0; i < 26; i++) body += crockford[Number((bits >> BigInt(5 * (25 - i) + 6)) & 31n)]
  return `led_${body}` as LedgerEntryId
}

const isAccountId = Schema.is(AccountId)

const paidTypes = new Set(["checkout.session.completed", "checkout.session.async_payment_succeeded"])

/** The purchase an event records, or none when the event is not a paid checkout. */
const purchaseOf = (event: PaymentEvent) => {
  const session = event.data.object
  if (!paidTypes.has(event.type) || session.payment_status !== "paid") return Option.none()
  return Option.some(session)
}

const readAll = (body: Stream.Stream<Uint8Array, ApiError>) =>
  Effect.map(Stream.runCollect(body), (chunks) => Buffer.concat(Chunk.toArray(chunks)))

/** The credit routes. */
export const routes = [
  documented(
    authRoute({
      method: "POST",
      path: "/v1/credit/checkout",
      access: "owner",
      body: CheckoutRequest,
      bodyLimit: 4 * 1024,
      handler: ({ principal, body }) =>
        Effect.gen(function* () {
          const processor = yield* PaymentProcessor
          const session = yield* processor.createCheckout({
            account: principal.account.id,
            amount_usd_cents: body.amount_usd_cents,
          })
          return json({ url: session.url }, { status: 201 })
        }),
    }),
    {
      summary: "A payment page to buy $5 to $500 of credit",
      body: CheckoutRequest,
      response: { status: 201, schema: CheckoutResponse },
    },
  ),
  documented(
    streamRoute({
      method: "POST",
      path: "/v1/credit/callback",
      bodyLimit: callbackBodyLimit,
      handler: ({ body, headers }) =>
        Effect.gen(function* () {
          const processor = yield* PaymentProcessor
          const payload = yield* readAll(body)
          const event = yield* processor.verifyCallback(payload, headers["stripe-signature"])
          const found = purchaseOf(event)
          if (Option.isNone(found)) return json({ received: true, credited: false })
          const session = found.value
          const account = session.metadata?.account ?? session.client_reference_id ?? ""
          if (!isAccountId(account))
            return yield* Effect.fail(ApiError.invalidRequest("metadata.account: missing"))
          if (Option.isNone(yield* (yield* Accounts).account(account)))
            return yield* Effect.fail(ApiError.invalidRequest("metadata.account: no such account"))
          if (
            (session.currency ?? "").toLowerCase() !== "usd" ||
            !Number.isSafeInteger(session.amount_total ?? NaN)
          )
            return yield* Effect.fail(ApiError.invalidRequest("amount_total: must be whole US cents"))
          const entry_id = purchaseEntryId(session.id)
          const mailbox = yield* Mailbox
          yield* mailbox.send(
            Account,
            account,
            {
              _tag: "Adjust",
              entry_id,
              kind: "purchase",
              amount_usd_nanos: (session.amount_total ?? 0) * nanosPerCent,
              effective_at: timestamp(event.created * 1000),
              reference: session.id,
            },
            { msgId: entry_id },
          )
          yield* Effect.logInfo("credit purchased").pipe(
            Effect.annotateLogs({ account, session: session.id, event: event.id, entry: entry_id }),
          )
          return json({ received: true, credited: true })
        }),
    }),
    {
      summary:
        "The payment processor's signed callback (Stripe-Signature); a paid checkout credits the account once",
    },
  ),
]
