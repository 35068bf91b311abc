/**
 * The API's error envelope and error codes (spec "Errors", with DESIGN.md's decisions for the
 * codes the spec leaves open). Clients switch on `code`; `error` is a message for people.
 */
import { Schema } from "effect"

/**
 * Every error code with its HTTP status. The spec's table, plus DESIGN.md: `run_ended` 409,
 * `memory_limit` 429 (the spec's unnamed 429), `rate_limited` 429; and our own choice of 413
 * `payload_too_large` for a request body over the gateway's size limit.
 */
export const errorStatus = {
  invalid_request: 400,
  invalid_signature: 400,
  account_required: 400,
  unauthenticated: 401,
  no_credit: 402,
  key_scope: 403,
  people_only: 403,
  not_a_member: 403,
  owners_only: 403,
  suspended: 403,
  csrf_token: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  run_ended: 409,
  payload_too_large: 413,
  memory_limit: 429,
  rate_limited: 429,
  internal: 500,
  vendor_unavailable: 502,
  purchases_closed: 503,
} as const

/** An error code the API answers with. */
export const ErrorCode = Schema.Literal(
  ...(Object.keys(errorStatus) as Array<keyof typeof errorStatus>),
).annotations({ identifier: "ErrorCode" })
export type ErrorCode = typeof ErrorCode.Type

/** The codes a client should retry unchanged (spec: "Retry `conflict` and `internal`"). */
export const retryableCodes: ReadonlySet<ErrorCode> = new Set<ErrorCode>(["conflict", "internal"])

/** The JSON body of every error response. */
export const ErrorBody = Schema.Struct({
  error: Schema.String,
  code: ErrorCode,
}).annotations({ identifier: "ErrorBody" })
export type ErrorBody = typeof ErrorBody.Type

/**
 * An error that leaves through the API: its `code` decides the HTTP status, its `message`
 * becomes the body's `error`. Tagged so it can cross the bus (an actor's answer to an ask).
 */
export class ApiError extends Schema.TaggedError<ApiError>()("ApiError", {
  code: ErrorCode,
  message: Schema.String,
}) {
  /** The HTTP status of this error's code. */
  get status(): number {
    return errorStatus[this.code]
  }

  /** The response body `{error, code}`. */
  get body(): ErrorBody {
    return { error: this.message, code: this.code }
  }

  /** An error with the given code and message. */
  static of(code: ErrorCode, message: string): ApiError {
    return new ApiError({ code, message })
  }

  /** 400: the request is not valid; the message names the field. */
  static invalidRequest(message: string): ApiError {
    return new ApiError({ code: "invalid_request", message })
  }
  /** 400: a payment-processor callback's signature did not verify. */
  static invalidSignature(message = "the signature did not verify"): ApiError {
    return new ApiError({ code: "invalid_signature", message })
  }
  /** 400: a person's token came without the `Service-Account` header. */
  static accountRequired(message = "a person's token needs the Service-Account header"): ApiError {
    return new ApiError({ code: "account_required", message })
  }
  /** 401: no credential, or a wrong, expired or revoked one. */
  static unauthenticated(message = "missing or invalid credential"): ApiError {
    return new ApiError({ code: "unauthenticated", message })
  }
  /** 402: the balance is at the account's minimum; runs cannot start. */
  static noCredit(message = "the account has no credit left"): ApiError {
    return new ApiError({ code: "no_credit", message })
  }
  /** 403: the key's scope does not allow the route. */
  static keyScope(message = "this key's scope does not allow this request"): ApiError {
    return new ApiError({ code: "key_scope", message })
  }
  /** 403: the route is for a person signed in, not keys. */
  static peopleOnly(message = "this route is for people signed in, not keys"): ApiError {
    return new ApiError({ code: "people_only", message })
  }
  /** 403: the person is not a member of the named account. */
  static notAMember(message = "you are not a member of this account"): ApiError {
    return new ApiError({ code: "not_a_member", message })
  }
  /** 403: the route is for owners. */
  static ownersOnly(message = "this route is for the account's owners"): ApiError {
    return new ApiError({ code: "owners_only", message })
  }
  /** 403: the account is suspended. */
  static suspended(message = "the account is suspended"): ApiError {
    return new ApiError({ code: "suspended", message })
  }
  /** 404: no such resource in this account, e.g. `ApiError.notFound("run")` → "run not found". */
  /** A request signed in by the console's cookie that changes something without its CSRF token. */
  static csrfToken(
    message = "a request signed in by the console's session needs its x-csrf-token header",
  ): ApiError {
    return new ApiError({ code: "csrf_token", message })
  }

  static notFound(what = "route"): ApiError {
    return new ApiError({ code: "not_found", message: `${what} not found` })
  }
  /** 405: the route does not take this method. */
  static methodNotAllowed(method?: string): ApiError {
    return new ApiError({
      code: "method_not_allowed",
      message: method ? `this route does not take ${method}` : "this route does not take this method",
    })
  }
  /** 409: another write changed the same thing first; retry. */
  static conflict(message = "another write changed this first; retry"): ApiError {
    return new ApiError({ code: "conflict", message })
  }
  /** 409: a command was sent to a run that has ended. */
  static runEnded(message = "the run has ended"): ApiError {
    return new ApiError({ code: "run_ended", message })
  }
  /** 413: the request body is larger than the route accepts. */
  static payloadTooLarge(limitBytes: number): ApiError {
    return new ApiError({ code: "payload_too_large", message: `request body over ${limitBytes} bytes` })
  }
  /** 429: the account's running runs would pass its memory limit. */
  static memoryLimit(message = "the account's runs would pass its memory limit"): ApiError {
    return new ApiError({ code: "memory_limit", message })
  }
  /** 429: too many requests for this credential; the gateway adds `Retry-After`. */
  static rateLimited(message = "too many requests; retry later"): ApiError {
    return new ApiError({ code: "rate_limited", message })
  }
  /** 500: service failure; retry. The message never carries internals. */
  static internal(message = "internal error; retry"): ApiError {
    return new ApiError({ code: "internal", message })
  }
  /** 502: the model vendor's catalog could not be read. */
  static vendorUnavailable(message = "the model vendor could not be reached"): ApiError {
    return new ApiError({ code: "vendor_unavailable", message })
  }
  /** 503: buying credit is not open. */
  static purchasesClosed(message = "buying credit is not open"): ApiError {
    return new ApiError({ code: "purchases_closed", message })
  }
}
