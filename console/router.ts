/**
 * Path routing for the console: the server answers the same page on every console path, and the
 * app draws the one the address names. Links change the address with `history.pushState`.
 */
import { useEffect, useState } from "preact/hooks"

const listeners = new Set<() => void>()

/** Goes to `path` in the app (no page load). */
export const navigate = (path: string, replace = false) => {
  if (replace) history.replaceState(null, "", path)
  else history.pushState(null, "", path)
  for (const l of listeners) l()
}

addEventListener("popstate", () => {
  for (const l of listeners) l()
})

/** The current path and query, redrawn on each change. */
export const useLocation = (): { readonly path: string; readonly query: URLSearchParams } => {
  const [, setTick] = useState(0)
  useEffect(() => {
    const l = () => setTick((t) => t + 1)
    listeners.add(l)
    return () => {
      listeners.delete(l)
    }
  }, [])
  return { path: location.pathname, query: new URLSearchParams(location.search) }
}

/** Matches `/runs/:id` against a path: the parameters, or undefined. */
export const match = (pattern: string, path: string): Record<string, string> | undefined => {
  const p = pattern.split("/")
  const s = path.split("/")
  if (p.length !== s.length) return undefined
  const params: Record<string, string> = {}
  for (let i = 0; i < p.length; i++) {
    const part = p[i]!
    if (part.startsWith(":")) params[part.slice(1)] = decodeURIComponent(s[i]!)
    else if (part !== s[i]) return undefined
  }
  return params
}

/** A click on an in-app link: handled here unless a modifier asks for a new tab. */
export const onLinkClick = (e: MouseEvent) => {
  const a = (e.currentTarget as HTMLAnchorElement | null) ?? undefined
  if (a === undefined || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return
  e.preventDefault()
  navigate(a.getAttribute("href") ?? "/")
}
