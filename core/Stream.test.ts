import { expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import { attempt, Nats } from "./Nats.ts"
import { Storage } from "./Storage.ts"
import * as JsStream from "./Stream.ts"

layer(layerAll())("Stream.publish", (it) => {
  it.effect("a message published twice with the same msgId is stored once", () =>
    Effect.gen(function* () {
      const { names } = yield* Storage
      const { jsm } = yield* Nats
      const subject = names.subjects.events("acc_x", uniqueName("run"))
      const msgId = uniqueName("m")
      const first = yield* JsStream.publish(subject, "one", { msgId })
      const again = yield* JsStream.publish(subject, "one", { msgId })
      expect(first).toMatchObject({ stream: names.streams.EVENTS.name, duplicate: false })
      expect(again).toEqual({ ...first, duplicate: true })
      const other = yield* JsStream.publish(subject, "two", {
        msgId: uniqueName("m"),
        headers: { "Hangar-Kind": "t" },
      })
      expect(other.seq).toBe(first.seq + 1)
      const info = yield* attempt("info", () =>
        jsm.streams.info(names.streams.EVENTS.name, { subjects_filter: subject }),
      )
      expect(info.state.subjects?.[subject]).toBe(2)
      const stored = yield* attempt("get", () =>
        jsm.streams.getMessage(names.streams.EVENTS.name, { seq: other.seq }),
      )
      expect(stored?.header.get("Hangar-Kind")).toBe("t")
    }),
  )

  it.effect("a schedule in MAILBOX fires its payload into the target mailbox subject", () =>
    Effect.gen(function* () {
      const { names } = yield* Storage
      const { js, jsm } = yield* Nats
      const id = uniqueName("run")
      const target = names.subjects.mailbox("run", 3, id)
      const at = new Date(Date.now() + 1000)
      yield* JsStream.publish(names.subjects.timer("run", 3, id, "start"), "wake", {
        msgId: uniqueName("m"),
        schedule: { at, target },
      })
      const stream = names.streams.MAILBOX.name
      yield* attempt("consumer", () =>
        jsm.consumers.add(stream, { durable_name: id, filter_subject: target, ack_policy: "explicit" }),
      )
      const consumer = yield* attempt("consumer", () => js.consumers.get(stream, id))
      const msg = yield* attempt("next", () => consumer.next({ expires: 10_000 }))
      expect(msg?.subject).toBe(target)
      expect(msg?.string()).toBe("wake")
      msg?.ack()
    }),
  )
})
