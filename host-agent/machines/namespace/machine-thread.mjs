// The machine thread's entry (`NamespaceDriver.ts` starts it and says why): the driver's
// TypeScript is loaded through tsx, as in the process that started the thread.
import { register } from "tsx/esm/api"

register()
await import("./NamespaceDriver.ts")
