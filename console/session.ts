/** What every page knows: the signed-in person, the chosen account and their role in it. */
import { createContext } from "preact"
import { useContext } from "preact/hooks"

export interface Who {
  readonly email: string
  readonly account: string
  readonly role: "owner" | "member" | ""
  readonly accounts: ReadonlyArray<{ readonly account: string; readonly name: string; readonly role: string }>
}

export const WhoContext = createContext<Who>({ email: "", account: "", role: "", accounts: [] })

/** The signed-in person and account. */
export const useWho = () => useContext(WhoContext)
