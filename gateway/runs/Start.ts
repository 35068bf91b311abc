/**
 * `POST /v1/functions/{id}/runs`: starts a run. Checks, in order, each refusal changing nothing:
 *
 * 1. the caller: a suspended account gets 403 `suspended` (the auth step: POST routes are closed
 *    while suspended; checked again on the freshly read account, so a suspension written a moment
 *    ago, not yet in the auth cache, still stops the start); a run key whose `functions` list does not name the function, 403 `key_scope`;
 * 2. the body (`StartRunRequest`): 400 naming the field (`prompt` over 131,072 characters,
 *    `webhook` not https, `external_reference` over 256 bytes, an unknown field…);
 * 3. the function (404 when not in this account) and `version` (0 or absent = the latest; a
 *    version that does not exist: 400 naming `version`);
 * 4. `input`: required when the version's input manifest names entries, and then (or whenever it
 *    is given) a complete upload of this account (400 naming `input`: missing, unknown or another
 *    account's — both read as "no such upload" — or still pending);
 * 5. the size: one of the account's `limits.sizes` (400 naming `size`; limits read fresh);
 * 6. the provider: `prv_…@latest` is pinned to the provider's newest version now (`@<n>`), so the
 *    run uses one fixed version whatever is published while it runs; `@<n>` and `none` stay;
 * 7. the account's webhook key exists when `webhook` is given (made on first use, so the first
 *    event can be signed);
 * 8. the account actor's `MayStart` (the run id is made first and the ask carries it, so a retry
 *    holds memory once): 402 `no_credit` at the minimum balance, 429 `memory_limit` when the
 *    account's queued and running runs would pass its memory limit;
 * 9. the run actor's `Create` → 201 with the run.
 *
 * When `Create` does not answer (timeout) or fails, the memory hold is released (`Release`, sent
 * after `MayStart` by this same sender, so it is handled after it), and after a timeout the run
 * actor is also sent `Fail` (`infrastructure`) behind the `Create`: if the `Create` is still handled
 * later, the run ends at once instead of running unseen. The caller gets 500 `internal` (retry).
 */
import { Clock, Effect, Option, Schema } from "effect"
import { Accounts } from "../../core/Accounts.ts"
import { webhookKey } from "../../core/actors/AccountClient.ts"
import { Mailbox } from "../../core/actors/Mailbox.ts"
import { both } from "../../core/Concurrent.ts"
import { Functions } from "../../core/Functions.ts"
import type { Nats } from "../../core/Nats.ts"
import { Providers } from "../../core/Providers.ts"
import type { Storage } from "../../core/Storage.ts"
import { Uploads } from "../../core/Uploads.ts"
import { Account } from "../../schema/actors/Account.ts"
import { Run as RunActor } from "../../schema/actors/Run.ts"
import { timestamp } from "../../schema/Common.ts"
import { decodeBody } from "../../schema/Decode.ts"
import { ApiError } from "../../schema/Errors.ts"
import {
  type Actor,
  noProvider,
  type ProviderId,
  parseProviderRef,
  providerRef,
  type RunId,
} from "../../schema/Ids.ts"
import { sizes } from "../../schema/Limits.ts"
import { Run, StartRunRequest } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { actorOf } from "../auth/Access.ts"
import { authRoute } from "../auth/Route.ts"
import { attemptTag, HEADER, newId } from "../Idempotency.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"
import { linkBase, mayUse, orInternal, RunRouteSettings, RunStore, showRun } from "./Runs.ts"

const decodeStart = decodeBody(StartRunRequest)

const field = (name: string, message: string) => ApiError.invalidRequest(`${name}: ${message}`)

/** Pins `prv_…@latest` to the provider's newest version; other references are kept. */
const pinProvider = (account: string, ref: string) =>
  Effect.gen(function* () {
    if (ref === noProvider) return ref
    const parsed = parseProviderRef(ref)
    if (parsed.version !== "latest") return ref
    const providers = yield* Providers
    const head = yield* orInternal(providers.head(account, parsed.provider), "provider read")
    if (Option.isNone(head)) {
      return yield* Effect.fail(
        field("provider", `the function's provider ${parsed.provider} no longer exists`),
      )
    }
    return providerRef(head.value.id as ProviderId, head.value.latest)
  })

/** The route. */
export const startRoute = documented(
  authRoute({
    method: "POST",
    path: "/v1/functions/:id/runs",
    access: "member",
    // Decoded in the handler, after the key's scope: a key that may not start the function learns
    // nothing about its body rules.
    body: Schema.Unknown,
    handler: ({ principal, params, body: raw, headers }) =>
      Effect.gen(function* () {
        const functions = yield* Functions
        const uploads = yield* Uploads
        const mailbox = yield* Mailbox
        const settings = yield* RunRouteSettings.Tag
        // Limits read fresh (the principal's record comes from a watched cache, which may be a
        // moment behind an operator's change); the cached one if the account vanished meanwhile.
        // Both read at once (the start waits on them); refused below in the order above.
        const readAccount = orInternal((yield* Accounts).account(principal.account.id), "account read")
        const readFunction = orInternal(functions.get(principal.account.id, params.id), "function read")
        const [fresh, fn] = yield* both(readAccount, readFunction)
        const account = Option.getOrElse(fresh, () => principal.account)
        // The auth step refused it if its cache knew; a suspension just written is caught here.
        if (account.state === "suspended") return yield* Effect.fail(ApiError.suspended())

        if (!mayUse(principal, params.id)) return yield* Effect.fail(ApiError.keyScope())
        const body = yield* decodeStart(raw)
        if (Option.isNone(fn)) return yield* Effect.fail(ApiError.notFound("function"))
        const n = body.version === 0 ? fn.value.latest : body.version
        const found = yield* orInternal(functions.version(fn.value.id, n), "version read")
        if (Option.isNone(found)) {
          return yield* Effect.fail(
            field("version", `function ${fn.value.id} has no version ${n} (latest: ${fn.value.latest})`),
          )
        }
        const version = found.value

        if (body.input === undefined) {
          if (version.input_manifest.length > 0) {
            return yield* Effect.fail(
              field(
                "input",
                `is required: version ${n}'s input manifest names ${version.input_manifest.length} entries`,
              ),
            )
          }
        } else {
          const upload = yield* orInternal(uploads.get(body.input), "upload read")
          if (Option.isNone(upload) || upload.value.value.account !== account.id) {
            return yield* Effect.fail(field("input", `no upload ${body.input} in this account`))
          }
          if (upload.value.value.state !== "complete") {
            return yield* Effect.fail(
              field("input", `upload ${body.input} has not been completed (send its PUT first)`),
            )
          }
        }

        if (!account.limits.sizes.includes(version.size)) {
          return yield* Effect.fail(
            field(
              "size",
              `this account may not use size ${version.size} (allowed: ${account.limits.sizes.join(", ") || "none"})`,
            ),
          )
        }
        const memoryMib = sizes[version.size].memoryMib
        const provider = yield* pinProvider(account.id, version.provider)

        if (body.webhook !== undefined) {
          yield* orInternal(
            webhookKey(account.id, settings.askTimeoutMs) as Effect.Effect<string, unknown, Nats | Storage>,
            "webhook key",
          )
        }

        const id = (yield* newId("run")) as RunId
        const attempt = attemptTag()
        const timeout = settings.askTimeoutMs
        // An Idempotency-Key retry of a start whose answer was lost: the run it made is the answer
        // (nothing is held or created again).
        const stored = (runKey: string) =>
          Effect.flatMap(RunStore, (store) =>
            orInternal(store.get(kvKeys.run(account.id, runKey)), "run read").pipe(
              Effect.map(Option.map((e) => e.value)),
            ),
          )
        if (headers[HEADER] !== undefined) {
          const prior = yield* stored(id)
          if (Option.isSome(prior))
            return json(yield* showRun(prior.value, yield* linkBase(headers)), { status: 201 })
        }
        const mayStart = yield* orInternal(
          mailbox.ask(
            Account,
            account.id,
            { _tag: "MayStart", run: id, memory_mib: memoryMib, limit_mib: account.limits.memory_mib },
            { timeout, msgId: `maystart:${id}:${attempt}` },
          ),
          "MayStart",
        ).pipe(Effect.tapError(() => release(account.id, id, attempt)))
        if ("refused" in mayStart) {
          return yield* Effect.fail(
            mayStart.refused === "no_credit"
              ? ApiError.noCredit("the account's balance is at its minimum; runs cannot start")
              : ApiError.memoryLimit(
                  `a ${version.size} run (${memoryMib} MiB) would pass the account's memory limit of ${account.limits.memory_mib} MiB`,
                ),
          )
        }
        if (!("ok" in mayStart)) return yield* Effect.fail(ApiError.internal())

        const now = yield* Clock.currentTimeMillis
        const created = yield* mailbox
          .ask(
            RunActor,
            id,
            {
              _tag: "Create",
              id,
              account: account.id,
              function: fn.value.id,
              version: n,
              base: version.base,
              size: version.size,
              memory_mib: memoryMib,
              provider,
              prompt: body.prompt,
              ...(body.input === undefined ? {} : { input: body.input }),
              ...(body.webhook === undefined ? {} : { webhook: body.webhook }),
              ...(body.external_reference === undefined
                ? {}
                : { external_reference: body.external_reference }),
              timeout_minutes: version.timeout_minutes,
              created_at: timestamp(now),
              created_by: actorOf(principal) as Actor,
            },
            { timeout, msgId: `create:${id}:${attempt}` },
          )
          .pipe(
            Effect.tapError((e) =>
              Effect.gen(function* () {
                // The run actor may have created it and only its answer was late: that run is
                // the answer (below), not abandoned.
                if (
                  e._tag === "AskTimeout" &&
                  Option.isSome(yield* Effect.orElseSucceed(stored(id), () => Option.none()))
                )
                  return
                if (e._tag === "AskTimeout") {
                  yield* mailbox
                    .send(
                      RunActor,
                      id,
                      {
                        _tag: "Fail",
                        failure: "infrastructure",
                        detail: "the run could not be created in time; start it again",
                        at: timestamp(yield* Clock.currentTimeMillis),
                      },
                      { msgId: `create-abandoned:${id}` },
                    )
                    .pipe(Effect.ignore)
                }
                yield* release(account.id, id, attempt)
              }),
            ),
            Effect.catchTag("AskTimeout", (e) =>
              Effect.flatMap(
                Effect.orElseSucceed(stored(id), () => Option.none()),
                (found) => (Option.isSome(found) ? Effect.succeed({ run: found.value }) : Effect.fail(e)),
              ),
            ),
            (fx) => orInternal(fx, "run Create"),
          )
        if (!("run" in created)) {
          yield* release(account.id, id, attempt)
          return yield* Effect.fail(ApiError.internal())
        }
        yield* Effect.logInfo("run started").pipe(
          Effect.annotateLogs({ run: id, account: account.id, function: fn.value.id, version: n }),
        )
        return json(yield* showRun(created.run, yield* linkBase(headers)), { status: 201 })
      }),
  }),
  {
    summary: "Start a run of a function.",
    body: StartRunRequest,
    response: { status: 201, schema: Run },
  },
)

/** The run's memory hold goes (idempotent; best effort: a failure is logged). */
const release = (account: string, run: RunId, attempt: string) =>
  Effect.flatMap(Mailbox, (m) =>
    m.send(Account, account, { _tag: "Release", run }, { msgId: `release:${run}:${attempt}` }),
  ).pipe(
    Effect.tapError((e) =>
      Effect.logError("run memory release failed", e).pipe(Effect.annotateLogs({ run })),
    ),
    Effect.ignore,
  )
