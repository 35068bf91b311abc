import { Effect } from "effect"
import { beforeAll, expect, it } from "vitest"
import { type Base, ensureTestBase } from "../../bases/Bases.ts"
import { connect } from "../../guest/GuestSession.ts"
import { scopedOn } from "../MachineDriver.ts"
import { make } from "./NamespaceDriver.ts"
import { leftovers, newKeys, testDriverSettings, testId } from "./testing.ts"

const driver = make(testDriverSettings)
const keys = newKeys()
let base: Base

beforeAll(async () => {
  base = await ensureTestBase()
}, 15 * 60_000)

it("leaves no process, mount, loop device, cgroup, veth, netns or file after 20 create/destroy cycles", async () => {
  const ids: Array<string> = []
  for (let i = 0; i < 20; i++) {
    const id = testId(`heavy${i}`)
    ids.push(id)
    const out = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const machine = yield* scopedOn(driver, {
            id,
            size: "s",
            base: base.rootfs,
            authorizedKey: keys.client.public,
            hostKey: keys.host.private,
          })
          const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
          // A background process and a file on the workspace, both of which must go with the machine.
          return yield* guest.bash({ command: "(setsid sleep 1000 &); echo data > /workspace/f; echo ok" })
        }),
      ),
    )
    expect(out.output).toBe("ok\n")
  }
  for (const id of ids) expect(await leftovers(id)).toEqual([])
}, 180_000)
