/**
 * The actors role: an actor worker hosting the account, run, scheduler and webhook actors. It
 * connects and holds until interrupted. Settings come from the environment: `HANGAR_ACTOR_*`
 * (runtime), `HANGAR_RUN_*` (run timers), `HANGAR_SCHEDULER_*` (scheduler tick), `HANGAR_WEBHOOK_*`
 * (delivery), `HANGAR_PUBLIC_URL` and the link key (output links in run events), `HANGAR_AGENT_*`
 * (agent loops), `HANGAR_*_BASE_URL` and `HANGAR_VENDOR_*` (the model vendors).
 *
 * Beside the worker runs the agent supervisor (`agent/Supervisor.ts`): the agent loops of runs
 * with a provider, with the chat client and the function, provider and secret stores they read.
 */
import { Effect, Layer } from "effect"
import * as Mailbox from "../core/actors/Mailbox.ts"
import { ActorSettings } from "../core/actors/Settings.ts"
import * as Worker from "../core/actors/Worker.ts"
import * as Functions from "../core/Functions.ts"
import * as Keyring from "../core/Keyring.ts"
import * as Links from "../core/Links.ts"
import * as MasterKey from "../core/MasterKey.ts"
import type { Nats } from "../core/Nats.ts"
import * as Providers from "../core/Providers.ts"
import * as Seal from "../core/Seal.ts"
import * as Secrets from "../core/Secrets.ts"
import type { Storage } from "../core/Storage.ts"
import * as ChatClient from "../core/vendors/ChatClient.ts"
import { VendorSettings } from "../core/vendors/Vendors.ts"
import * as WrappedKeyStore from "../core/WrappedKeyStore.ts"
import * as AccountActor from "./account/Account.ts"
import { AgentSettings } from "./agent/Settings.ts"
import * as Supervisor from "./agent/Supervisor.ts"
import * as RunActor from "./run/Run.ts"
import { RunSettings } from "./run/Settings.ts"
import * as SchedulerActor from "./scheduler/Scheduler.ts"
import { WebhookSettings } from "./webhooks/Settings.ts"
import * as WebhookActor from "./webhooks/Webhook.ts"

// The account actor seals webhook private keys under the account's data key, wrapped by the same
// master key and kept in the same `secrets` bucket as the gateway's secrets.
const sealLayer = Seal.layer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layer, WrappedKeyStore.layerStorage)),
  Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
)

// Every actor type this worker hosts, built from the process's connection, storage and settings.
const actors = Effect.all([AccountActor.actor, RunActor.actor, SchedulerActor.actor, WebhookActor.actor])

// The agent loops: the supervisor beside the worker (it names its leases after the worker).
const agents = Supervisor.layer.pipe(
  Layer.provide(
    Layer.mergeAll(
      Functions.layer,
      Providers.layer,
      Secrets.layer.pipe(Layer.provide(sealLayer)),
      ChatClient.layer,
      sealLayer,
    ),
  ),
  Layer.provide(
    Layer.mergeAll(
      AgentSettings.layerFromEnv,
      VendorSettings.layerFromEnv,
      ChatClient.ChatSettings.layerFromEnv,
    ),
  ),
)

/** The worker with its actor types and the agent supervisor; needs the process's NATS connection and storage. */
export const layer = agents.pipe(
  Layer.provideMerge(Layer.unwrapScoped(Effect.map(actors, (list) => Worker.layer(list)))),
  Layer.tap(() => Effect.logInfo("actor worker ready").pipe(Effect.annotateLogs({ role: "actors" }))),
  Layer.provide(Layer.mergeAll(sealLayer, Mailbox.layer, Links.layer)),
  Layer.provide(
    Layer.mergeAll(
      RunSettings.layerFromEnv,
      SchedulerActor.SchedulerSettings.layerFromEnv,
      WebhookSettings.layerFromEnv,
      Links.LinkSettings.layerFromEnv,
    ),
  ),
  Layer.provide(ActorSettings.layerFromEnv),
) satisfies Layer.Layer<Worker.Worker, unknown, Nats | Storage>
