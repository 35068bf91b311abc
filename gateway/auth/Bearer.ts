/**
 * The bearer value of an `Authorization` header: `Bearer ` (any case) and one or more printable
 * ASCII characters, nothing else; none when the header is missing or says something else. The
 * auth step and the rate limiter read a request's credential with this one rule.
 */
export const bearerOf = (authorization: string | undefined): string | undefined =>
  /^Bearer ([\x21-\x7e]+)$/i.exec(authorization ?? "")?.[1]
