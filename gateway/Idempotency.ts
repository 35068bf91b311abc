/**
 * `Idempotency-Key` on the creating routes (Stripe's convention), so a client that follows the
 * spec's retry rule ("retry `internal` and `conflict`") never creates or bills a thing twice.
 *
 * For an authenticated `POST` with the header (1 to 255 printable ASCII characters), the answer is
 * kept 24 hours in KV `idempotency` under a hash of the credential (a key or a person, in its
 * account), the route, its path parameters and the key, with a hash of the request (query and
 * decoded body):
 *
 * - the first request claims the key (`pending`) and runs; an answer below 500 is kept (`done`),
 *   and the same key with the same request answers it again (`idempotent-replayed: true`);
 * - the same key with another request answers `409 conflict` naming the header;
 * - the same key while the first is still running answers `409 conflict` with `Retry-After`;
 * - an answer of 500 (or a gateway that died meanwhile: a claim not renewed for 10 s) is not kept:
 *   the key is released for a retry, which runs again with the same ids. The ids a handler makes
 *   (`newId`) are seeded by the claim, so a run or command created by the first attempt, whose
 *   answer was lost, is found by the retry (the actors answer an existing id with its record)
 *   instead of made twice;
 * - an answer that held a secret shown once (a new key's token) is not kept: the same request
 *   again answers `409 conflict` saying so.
 */
import { createHash, randomFillSync } from "node:crypto"
import { Cause, Clock, Effect, Exit, Fiber, FiberRef, Option, Schema } from "effect"
import { type IdPrefix, makeId, seededId } from "../core/Ids.ts"
import * as Kv from "../core/Kv.ts"
import type { Nats } from "../core/Nats.ts"
import { Storage } from "../core/Storage.ts"
import { ApiError } from "../schema/Errors.ts"
import type { Reply } from "./Response.ts"
import { error as errorReply } from "./Response.ts"

/** The header, as the server sees it (lower case). */
export const HEADER = "idempotency-key"
const VALID = /^[\x21-\x7e]{1,255}$/
/**
 * The gateway handling a request renews its claim this often; a claim not renewed for
 * `STALE_CLAIM_MS` belongs to a gateway that died while handling it, and a retry takes it over (a
 * client retrying after a `kill -9` of the gateway waits seconds, not a minute).
 */
export const CLAIM_RENEW_MS = 3_000
export const STALE_CLAIM_MS = 10_000

const IdempotencyRecord = Schema.Struct({
  /** SHA-256 of the request (query and decoded body). */
  request: Schema.String,
  state: Schema.Literal("pending", "done", "released", "secret"),
  /** When the key was first claimed: the ids the handler makes are seeded by it. */
  at: Schema.Number,
  /** When the current claim was made. */
  claimed: Schema.Number,
  status: Schema.optional(Schema.Number),
  body: Schema.optional(Schema.String),
  content_type: Schema.optional(Schema.String),
})
type IdempotencyRecord = typeof IdempotencyRecord.Type

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex")

/** JSON with object keys sorted, so the same request written in another key order hashes the same. */
export const canonical = (value: unknown): string =>
  JSON.stringify(value, (_, v: unknown) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : 1)))
      : v,
  )

// The id maker of the current request: fresh ids, or ids seeded by an idempotent claim.
const idMaker = FiberRef.unsafeMake<(<P extends IdPrefix>(prefix: P) => `${P}_${string}`) | undefined>(
  undefined,
)

// Drawn from the CSPRNG a pool at a time: a randomBytes call per tag (one per created command)
// cost more than the rest of making it.
const TAGS_POOLED = 128
const tagPool = Buffer.alloc(6 * TAGS_POOLED)
let tagsTaken = TAGS_POOLED

/**
 * A tag of this attempt for message ids (`create:<run>:<attempt>`): a retry that runs again with the
 * same ids must not have its messages taken for duplicates of the first attempt's (the actors
 * recognise the ids themselves), while a publish retried within one attempt still is.
 */
export const attemptTag = (): string => {
  if (tagsTaken === TAGS_POOLED) {
    randomFillSync(tagPool)
    tagsTaken = 0
  }
  const at = 6 * tagsTaken++
  return tagPool.toString("base64url", at, at + 6)
}

/** A new id for what the request creates: the same one again when a retry of it runs. */
export const newId = <P extends IdPrefix>(prefix: P): Effect.Effect<`${P}_${string}`> =>
  Effect.map(FiberRef.get(idMaker), (make) => (make === undefined ? makeId(prefix) : make(prefix)))

/**
 * Whether the ids `newId` makes are this request's alone: true unless it carries an
 * `Idempotency-Key`, whose retries make the same ids again (even the first attempt's: its messages
 * may be stored after a retry's, behind a frozen server).
 */
export const idsFresh: Effect.Effect<boolean> = Effect.map(
  FiberRef.get(idMaker),
  (make) => make === undefined,
)

const conflict = (message: string) => ApiError.conflict(`${HEADER}: ${message}`)

const replay = (r: IdempotencyRecord): Reply => ({
  _tag: "Whole",
  status: r.status ?? 200,
  headers: { "idempotent-replayed": "true" },
  contentType: r.content_type ?? "application/json",
  body: r.body ?? "",
})

/**
 * Runs `handle` at most once per (scope, route, key, request): see the module comment. `scope`
 * names who may reuse a key (the account, or a person outside one); `secret` marks a route whose
 * answer must not be kept.
 */
export const around = <E, R>(
  request: {
    readonly method: string
    readonly route: string
    readonly params: Readonly<Record<string, string>>
    readonly headers: Readonly<Record<string, string | undefined>>
    readonly query: unknown
  },
  scope: string,
  body: unknown,
  handle: Effect.Effect<Reply, E, R>,
  options: { readonly secret?: boolean } = {},
): Effect.Effect<Reply, E | ApiError, R | Nats | Storage> => {
  const raw = request.headers[HEADER]
  if (raw === undefined || request.method !== "POST") return handle
  return Effect.gen(function* () {
    if (!VALID.test(raw))
      return yield* Effect.fail(
        ApiError.invalidRequest(`${HEADER}: must be 1 to 255 printable ASCII characters`),
      )
    const { names } = yield* Storage
    const store = yield* orInternal(Kv.make(names.kv.idempotency.name, IdempotencyRecord))
    const key = sha256(`${scope}\0${request.method}\0${request.route}\0${canonical(request.params)}\0${raw}`)
    const fingerprint = sha256(canonical({ query: request.query, body }))
    const now = yield* Clock.currentTimeMillis

    // Claim the key, or learn what an earlier request with it did.
    let claimedAt = now
    let claimRevision = 0
    for (let attempt = 0; ; attempt++) {
      const existing = yield* orInternal(store.get(key))
      if (Option.isNone(existing)) {
        const made = yield* Effect.either(
          store.create(key, { request: fingerprint, state: "pending", at: now, claimed: now }),
        )
        if (made._tag === "Right") {
          claimRevision = made.right
          break
        }
        if (made.left._tag !== "StateConflict" || attempt > 2) return yield* Effect.fail(ApiError.internal())
        continue
      }
      const { value: r, revision } = existing.value
      if (r.request !== fingerprint)
        return yield* Effect.fail(conflict("this key was first used with a different request; use a new key"))
      if (r.state === "done") return replay(r)
      if (r.state === "secret")
        return yield* Effect.fail(
          conflict("the first request with this key succeeded, and its answer held a secret shown only once"),
        )
      if (r.state === "pending" && now - r.claimed < STALE_CLAIM_MS)
        return errorReply(conflict("a request with this key is still being handled; retry shortly"), {
          "retry-after": "1",
        })
      // Released (its answer was a 500) or a stale claim: this request runs it again, same ids.
      const taken = yield* Effect.either(
        store.update(key, { ...r, state: "pending", claimed: now }, revision),
      )
      if (taken._tag === "Right") {
        claimedAt = r.at
        claimRevision = taken.right
        break
      }
      if (attempt > 2)
        return yield* Effect.fail(conflict("a request with this key is still being handled; retry shortly"))
    }

    const seeded = <P extends IdPrefix>(prefix: P) => seededId(prefix, claimedAt, key)
    // The outcome is recorded even when the client goes away mid-request (an interruption
    // releases the key at once rather than leaving a claim to go stale).
    // The claim is renewed while the request runs (a long ask), so only a dead gateway's goes stale.
    // Only the sleep is interruptible: a renewal the server took always moves `claimRevision`, so
    // the final write's compare-and-set is against the claim as it stands. A failed renewal is tried
    // again at the next beat; a lost compare-and-set (a retry took the claim over) ends renewing.
    const renewOnce = Effect.gen(function* () {
      const at = yield* Clock.currentTimeMillis
      claimRevision = yield* store.update(
        key,
        { request: fingerprint, state: "pending", at: claimedAt, claimed: at },
        claimRevision,
      )
    }).pipe(Effect.uninterruptible)
    const renew = Effect.gen(function* () {
      for (;;) {
        yield* Effect.sleep(CLAIM_RENEW_MS)
        const renewed = yield* Effect.either(renewOnce)
        if (renewed._tag === "Left" && renewed.left._tag === "StateConflict") return
      }
    })
    return yield* Effect.uninterruptibleMask((restore) =>
      Effect.gen(function* () {
        const renewing = yield* Effect.fork(restore(renew))
        const exit = yield* Effect.exit(restore(Effect.locally(handle, idMaker, seeded)))
        yield* Fiber.interrupt(renewing)
        const failure = Exit.isFailure(exit)
          ? Option.getOrUndefined(Cause.failureOption(exit.cause))
          : undefined
        const answer: Reply | undefined = Exit.isSuccess(exit)
          ? exit.value
          : failure instanceof ApiError
            ? errorReply(failure)
            : undefined
        // Kept: answers a retry must see again. Not kept (the key is released for a retry): server
        // failures, interruptions, and the answers the spec says to retry (`conflict`, a limit).
        const keep =
          answer !== undefined &&
          answer._tag === "Whole" &&
          answer.status < 500 &&
          answer.status !== 409 &&
          answer.status !== 429
            ? options.secret && answer.status < 300
              ? { state: "secret" as const }
              : {
                  state: "done" as const,
                  status: answer.status,
                  body:
                    typeof answer.body === "string" ? answer.body : Buffer.from(answer.body).toString("utf8"),
                  content_type: answer.contentType,
                }
            : { state: "released" as const }
        // Over this claim only (a retry that took over a stale claim wins); best effort: a record
        // not written leaves a claim a retry can take over once it is stale.
        yield* store
          .update(key, { request: fingerprint, at: claimedAt, claimed: now, ...keep }, claimRevision)
          .pipe(Effect.catchAll((e) => Effect.logWarning("idempotency record not written", e)))
        return yield* exit
      }),
    )
  })
}

const orInternal = <A, E, R>(fx: Effect.Effect<A, E, R>) =>
  Effect.catchAll(fx, (e) =>
    Effect.zipRight(Effect.logError("idempotency store failed", e), Effect.fail(ApiError.internal())),
  )
