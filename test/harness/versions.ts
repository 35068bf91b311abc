/** Function versions for tests that store them directly (not through the API). */
import { makeId } from "../../core/Ids.ts"
import type { Version } from "../../schema/Function.ts"
import type { Actor, BaseName, FunctionId, ProviderRef } from "../../schema/Ids.ts"

/**
 * Version `n` of function `fn`: no setup, no provider, a small output manifest (`result.txt`),
 * size `s`, 10 minutes; `over` replaces any field but the function, number and time.
 */
export const testVersion = (fn: FunctionId, n: number, over: Partial<Version> = {}): Version => ({
  base: "debian-bookworm-20261126-b7ddadfe773d" as BaseName,
  setup: [],
  provider: "none" as ProviderRef,
  system_prompt: "",
  tools: [],
  custom_tools: [],
  input_manifest: [],
  output_manifest: [{ path: "result.txt", max_bytes: 1000 }],
  environment: [],
  size: "s",
  timeout_minutes: 10,
  created_by: makeId("usr") as Actor,
  ...over,
  function: fn,
  version: n,
  created_at: new Date().toISOString(),
})
