/**
 * The credit route group's services: the payment processor and a mailbox client to send purchases
 * to the account actor.
 */
import { Layer } from "effect"
import { mailboxLayer } from "../../core/actors/AccountClient.ts"
import * as PaymentProcessor from "./PaymentProcessor.ts"

/** The group's routes. */
export { routes } from "./routes.ts"

/** The services with their settings read from `HANGAR_*` variables; needs NATS and the storage map. */
export const layerFromEnv = Layer.mergeAll(
  PaymentProcessor.layer.pipe(Layer.provide(PaymentProcessor.PaymentSettings.layerFromEnv)),
  mailboxLayer,
)
