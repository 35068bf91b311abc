/**
 * The key `hangar login` saved, per API address, in `$XDG_CONFIG_HOME/hangar/credentials.json`
 * (`~/.config/hangar/` when unset). The folder is 0700 and the file 0600, written to a temporary
 * file and renamed, so a crash never leaves half a file; the key is never printed.
 */
import { chmodSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs"
import { homedir } from "node:os"
import { join } from "node:path"

/** What is saved for one API address. */
export interface Saved {
  readonly key: string
  readonly account: string
  readonly key_id: string
  readonly name: string
}

/** The folder credentials live in. */
export const folder = (env: NodeJS.ProcessEnv = process.env): string =>
  join(env.XDG_CONFIG_HOME || join(homedir(), ".config"), "hangar")

const file = (env: NodeJS.ProcessEnv) => join(folder(env), "credentials.json")

const readAll = (env: NodeJS.ProcessEnv): Record<string, Saved> => {
  try {
    const parsed = JSON.parse(readFileSync(file(env), "utf8")) as unknown
    return typeof parsed === "object" && parsed !== null ? (parsed as Record<string, Saved>) : {}
  } catch {
    return {}
  }
}

/** The key saved for `api`, if any. */
export const load = (api: string, env: NodeJS.ProcessEnv = process.env): Saved | undefined => {
  const saved = readAll(env)[api]
  return typeof saved?.key === "string" ? saved : undefined
}

/** Saves the key for `api` (mode 0600), keeping those of other addresses. */
export const save = (api: string, saved: Saved, env: NodeJS.ProcessEnv = process.env): string => {
  const dir = folder(env)
  mkdirSync(dir, { recursive: true, mode: 0o700 })
  chmodSync(dir, 0o700)
  const all = { ...readAll(env), [api]: saved }
  const target = file(env)
  const temporary = `${target}.${process.pid}.tmp`
  writeFileSync(temporary, `${JSON.stringify(all, null, 2)}\n`, { mode: 0o600 })
  chmodSync(temporary, 0o600)
  renameSync(temporary, target)
  return target
}
