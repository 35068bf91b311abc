/**
 * Naming things on the command line: a function by its id or by its name, the latter only when
 * exactly one function has it (spec "Command-line tool"); otherwise a refusal that lists the ids.
 */
import type { Api } from "./Api.ts"
import { ApiRefused, UsageError } from "./Failures.ts"

/** A function as `GET /v1/functions` lists it (the fields the CLI reads). */
export interface FunctionItem {
  readonly id: string
  readonly name: string
  readonly latest: number
  readonly updated_at?: string
  readonly definition?: Record<string, unknown>
  readonly last?: { readonly id: string; readonly state: string; readonly created_at?: string }
}

const FUNCTION_ID = /^fnc_[0-9a-z]{26}$/

/** Every function of the account. */
export const listFunctions = async (api: Api): Promise<ReadonlyArray<FunctionItem>> =>
  (await api.call<{ functions: Array<FunctionItem> }>("GET", "/v1/functions")).functions

/** The functions named `name` (none, one, or several). */
export const named = (all: ReadonlyArray<FunctionItem>, name: string): ReadonlyArray<FunctionItem> =>
  all.filter((f) => f.name === name)

/** The id of the function `ref` names (an id as it is; a name only when exactly one has it). */
export const functionId = async (api: Api, ref: string): Promise<string> => {
  if (FUNCTION_ID.test(ref)) return ref
  const matches = named(await listFunctions(api), ref)
  if (matches.length === 1) return (matches[0] as FunctionItem).id
  if (matches.length === 0) throw new ApiRefused(404, "not_found", `no function is named ${ref}`)
  throw new UsageError(
    `${matches.length} functions are named ${ref}; name one by its id: ${matches.map((f) => f.id).join(", ")}`,
  )
}
