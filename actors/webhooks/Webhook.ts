/**
 * The webhook actor's handler (type `webhook`, id = the event id): delivers one event to the run's
 * webhook address. Contract in `schema/actors/Webhook.ts`, signatures in `Signing.ts`, settings in `Settings.ts`.
 *
 * - `Deliver` stores the event and makes the first attempt (at once with the default delays, else
 *   on the actor's `attempt` timer). A second `Deliver` of the same event changes nothing.
 * - `Attempt` (the timer) makes the next attempt. After attempt n fails, the timer is set
 *   `attemptDelaysMs[n]` later; after the last one the delivery is `gave_up`. A 2xx ends it
 *   (`delivered`). Every attempt is recorded in the state (time, status or error) and logged
 *   without the body, the signature or the URL's path and query.
 *
 * One attempt: the URL must be `https:` (anything else gives up at once: retrying cannot help);
 * the host is resolved and every address must be public (`core/PublicAddress.ts`, unless
 * `allowPrivateTargets`), and the connection goes to the address that was checked
 * (`core/PinnedPost.ts`: TLS still checks the certificate against the host name). The body is
 * POSTed with `content-type: application/json` and fresh Standard Webhooks headers: the same
 * `webhook-id` (the event id) every time, a new timestamp and signature (the account's Ed25519 key, opened from the account actor's state; made on first use by asking the
 * account actor). Redirects are not followed (a 3xx is a failed attempt). The whole attempt, from
 * resolving to the response's status line, is bounded by `answerTimeoutMs` (10 s).
 *
 * A run event's `data.output.url` is signed afresh at each attempt (`core/Links.ts`) from the
 * stored run in KV `runs`, so a receiver gets a link that works for 15 minutes from the attempt.
 *
 * The network work runs inside the handler, which DESIGN.md otherwise keeps out of handlers: one
 * actor per event means only this event waits, other actors of the partition run side by side, and
 * the timeout keeps the handler well under the runtime's ack wait. A worker that dies mid-attempt
 * makes the attempt again on redelivery, with the same `webhook-id`, which is what receivers
 * dedupe on. Failures to read the key or the run are `Retryable` (the message stays).
 */

import { readFileSync } from "node:fs"
import { rootCertificates } from "node:tls"
import { Clock, Data, Duration, Effect, Layer, Option } from "effect"
import { Mailbox, type MailboxService } from "../../core/actors/Mailbox.ts"
import * as State from "../../core/actors/State.ts"
import * as Kv from "../../core/Kv.ts"
import * as Links from "../../core/Links.ts"
import { Nats } from "../../core/Nats.ts"
import { postPinned } from "../../core/PinnedPost.ts"
import { resolvePublic } from "../../core/PublicAddress.ts"
import { Seal, type SealService } from "../../core/Seal.ts"
import { Storage } from "../../core/Storage.ts"
import { Account } from "../../schema/actors/Account.ts"
import * as Actor from "../../schema/actors/Actor.ts"
import { Webhook as Definition, type Deliver, type WebhookState } from "../../schema/actors/Webhook.ts"
import { timestamp } from "../../schema/Common.ts"
import { apiRun, StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { openWebhookKey } from "../account/Account.ts"
import { WebhookSettings, type WebhookSettingsShape } from "./Settings.ts"
import { signHeaders } from "./Signing.ts"

export { Webhook } from "../../schema/actors/Webhook.ts"

/** What the handler reaches besides its state. */
export interface WebhookDeps {
  readonly nats: Nats["Type"]
  readonly storage: Storage["Type"]
  readonly seal: SealService
  /** To ask the account actor for its webhook key when it has none yet. */
  readonly mailbox: MailboxService
  /** Signs the output links of run events. */
  readonly links: Links.LinksService
  readonly settings: WebhookSettingsShape
  /** Extra trusted certificate authorities (PEM), from `settings.caFile`; see `loadCa`. */
  readonly ca?: string | undefined
}

/** The timer that fires the next attempt. */
export const attemptTimer = "attempt"

/** The outcome of one attempt: a status, or why there was none; `final` = retrying cannot help. */
interface Outcome {
  readonly status?: number
  readonly error?: string
  readonly final?: boolean
}

/** An attempt that got no usable answer (refused address, connection, TLS, timeout). */
class AttemptFailed extends Data.TaggedError("AttemptFailed")<{ readonly message: string }> {}

const retryable = (what: string) => (cause: unknown) =>
  new Actor.Retryable({ message: `${what} failed`, cause })

/** The extra CA file's PEM text, or undefined when none is set. */
export const loadCa = (settings: WebhookSettingsShape) =>
  settings.caFile === ""
    ? Effect.succeed(undefined)
    : Effect.try({
        try: () => readFileSync(settings.caFile, "utf8"),
        catch: (e) => new Error(`cannot read HANGAR_WEBHOOK_CA_FILE ${settings.caFile}: ${String(e)}`),
      })

/** The name a run's output archive is downloaded under. */
export const outputFilename = (run: string) => `${run}.tar.gz`

/** The webhook actor with its dependencies. */
export const make = (deps: WebhookDeps) => {
  const { settings } = deps
  const delays = settings.attemptDelaysMs.length > 0 ? settings.attemptDelaysMs : [0]
  const ca = deps.ca === undefined ? undefined : [...rootCertificates, deps.ca]
  const provide = <A, E>(effect: Effect.Effect<A, E, Nats | Storage | Mailbox>) =>
    effect.pipe(
      Effect.provideService(Nats, deps.nats),
      Effect.provideService(Storage, deps.storage),
      Effect.provideService(Mailbox, deps.mailbox),
    )

  /** The account's signing key, made by the account actor if it has none yet. */
  const signingKey = (account: string) =>
    provide(
      Effect.gen(function* () {
        const read = State.read(Account, account).pipe(
          Effect.map(Option.flatMap((r) => Option.fromNullable(r.state.webhook_key))),
        )
        let key = yield* read
        if (Option.isNone(key)) {
          yield* deps.mailbox.ask(Account, account, { _tag: "EnsureWebhookKey" }, { timeout: "10 seconds" })
          key = yield* read
        }
        if (Option.isNone(key))
          return yield* new Actor.Retryable({ message: "the account has no webhook key" })
        return yield* openWebhookKey(deps.seal, account, key.value)
      }),
    ).pipe(Effect.mapError(retryable("loading the account's webhook key")))

  /** The body to post: a run event's `data.output` (when the run has output) with a fresh link. */
  const bodyOf = (d: Deliver) =>
    Effect.gen(function* () {
      if (d.type === "command.finished") return d.body
      let event: { data?: Record<string, unknown> }
      try {
        event = JSON.parse(d.body)
      } catch {
        return d.body // not ours to fix: posted as given
      }
      const runs = yield* Kv.make(deps.storage.names.kv.runs.name, StoredRun)
      const stored = yield* runs.get(kvKeys.run(d.account, d.run))
      const output = Option.getOrUndefined(stored)?.value.output
      if (event.data === undefined || (output === undefined && event.data.output === undefined)) return d.body
      const url = deps.links.download({
        store: "outputs",
        // The archive is `outputs/<run>`; the stored run names it when the projection has it.
        object: output?.object ?? d.run,
        account: d.account,
        filename: outputFilename(d.run),
      })
      if (output !== undefined && Option.isSome(stored)) {
        event.data.output = apiRun(stored.value.value, url).output
      } else {
        event.data.output = { ...(event.data.output as object), url }
      }
      return JSON.stringify(event)
    }).pipe(provide, Effect.mapError(retryable("reading the run for its output link")))

  /** One attempt: never fails except `Retryable` (key or run unreadable); the outcome says how it went. */
  const attemptOnce = (d: Deliver) =>
    Effect.gen(function* () {
      let url: URL
      try {
        url = new URL(d.url)
      } catch {
        return { error: "the webhook address is not a valid URL", final: true } satisfies Outcome
      }
      if (url.protocol !== "https:") return { error: "the webhook address is not https", final: true }
      if (url.username !== "" || url.password !== "")
        return { error: "the webhook address carries credentials", final: true }
      const key = yield* signingKey(d.account)
      const body = yield* bodyOf(d)
      const send = Effect.gen(function* () {
        const address = yield* resolvePublic(url.hostname, { allowPrivate: settings.allowPrivateTargets })
        const seconds = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const headers = signHeaders(key, d.event, seconds, body)
        const answer = yield* postPinned({
          url,
          address,
          headers: { ...headers },
          body,
          userAgent: "Hangar-Webhooks/1",
          maxBytes: 0,
          ca,
        })
        return answer.status
      })
      return yield* send.pipe(
        Effect.timeoutFail({
          duration: Duration.millis(settings.answerTimeoutMs),
          onTimeout: () => new AttemptFailed({ message: `no answer within ${settings.answerTimeoutMs} ms` }),
        }),
        Effect.map((status): Outcome => ({ status })),
        Effect.catchAll((e): Effect.Effect<Outcome> => Effect.succeed({ error: e.message })),
      )
    })

  const attempt = (state: WebhookState, ctx: Actor.ActorContext<typeof Definition.message.Type>) =>
    Effect.gen(function* () {
      const d = state.delivery!
      const outcome: Outcome = yield* attemptOnce(d)
      const now = yield* Clock.currentTimeMillis
      const made = state.made + 1
      const ok = outcome.status !== undefined && outcome.status >= 200 && outcome.status < 300
      const record = {
        at: timestamp(now),
        ...(outcome.status === undefined ? {} : { status: outcome.status }),
        ...(ok
          ? {}
          : { error: outcome.error ?? `the receiver answered ${outcome.status} (only 2xx counts)` }),
      }
      const last = ok || outcome.final === true || made >= delays.length
      const next: WebhookState = {
        ...state,
        attempts: [...state.attempts, record],
        made,
        state: ok ? "delivered" : last ? "gave_up" : "pending",
      }
      if (!last) ctx.schedule(attemptTimer, now + delays[made]!, { _tag: "Attempt" })
      yield* Effect.logInfo(
        ok ? "webhook delivered" : last ? "webhook gave up" : "webhook attempt failed",
      ).pipe(
        Effect.annotateLogs({
          event: d.event,
          run: d.run,
          type: d.type,
          host: URL.canParse(d.url) ? new URL(d.url).host : "(invalid)",
          attempt: made,
          ...(record.status === undefined ? {} : { status: record.status }),
          ...(record.error === undefined ? {} : { error: record.error }),
        }),
      )
      return { state: next }
    })

  return Actor.make({
    name: Definition.name,
    state: Definition.state,
    initial: Definition.initial,
    message: Definition.message,
    handler: (state: WebhookState, message, ctx) =>
      Effect.gen(function* () {
        switch (message._tag) {
          case "Deliver": {
            if (state.delivery !== undefined) return { state }
            const stored: WebhookState = { ...state, delivery: message }
            if (delays[0]! > 0) {
              ctx.schedule(attemptTimer, ctx.now + delays[0]!, { _tag: "Attempt" })
              return { state: stored }
            }
            return yield* attempt(stored, ctx)
          }
          case "Attempt": {
            if (state.delivery === undefined || state.state !== "pending") return { state }
            return yield* attempt(state, ctx)
          }
        }
      }),
  })
}

/** The webhook actor built from the process's connection, storage, seal, mailbox, links and settings. */
export const actor = Effect.gen(function* () {
  const settings = yield* WebhookSettings.Tag
  return make({
    nats: yield* Nats,
    storage: yield* Storage,
    seal: yield* Seal,
    mailbox: yield* Mailbox,
    links: yield* Links.Links,
    settings,
    ca: yield* loadCa(settings).pipe(Effect.orDie),
  })
})

/** Builds a layer from the webhook actor (e.g. `actorLayer((w) => Worker.layer([account, w]))`). */
export const actorLayer = <A, E, R>(f: (webhook: ReturnType<typeof make>) => Layer.Layer<A, E, R>) =>
  Layer.unwrapEffect(Effect.map(actor, f))
