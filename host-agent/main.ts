/**
 * The host-agent role: the host registers its driver, budget and bases in KV `hosts`, beats every
 * few seconds and reflects its capacity (machines held, vCPUs and memory free) into that record;
 * the host actor consumes the host's mailbox, takes placements within that capacity and runs each
 * run's machine (`runs/`); on shutdown every machine is ended (its run failed `infrastructure`)
 * before the record is removed.
 *
 * The host offers the bases of its recipes (`HANGAR_BASES`) and builds the missing ones in the
 * background at start (`bases/Builder.ts`).
 *
 * The machine driver is the host's decision (`HANGAR_MACHINE_DRIVER`, `namespace` by default, see
 * `HostSettings`). Sealed objects and environment secrets are opened with the account data keys,
 * wrapped by the same master key and kept in the same `secrets` bucket as the gateway's; download
 * links for `get` are signed with the shared link key (`core/Links.ts`).
 */
import { Effect, Layer } from "effect"
import * as Mailbox from "../core/actors/Mailbox.ts"
import { ActorSettings } from "../core/actors/Settings.ts"
import * as Functions from "../core/Functions.ts"
import * as Keyring from "../core/Keyring.ts"
import * as Links from "../core/Links.ts"
import * as MasterKey from "../core/MasterKey.ts"
import type { Nats } from "../core/Nats.ts"
import * as Seal from "../core/Seal.ts"
import * as SealStream from "../core/SealStream.ts"
import * as Secrets from "../core/Secrets.ts"
import type { Storage } from "../core/Storage.ts"
import { TerminalSettings } from "../core/TerminalSettings.ts"
import * as WrappedKeyStore from "../core/WrappedKeyStore.ts"
import { BasesSettings } from "./bases/Bases.ts"
import * as Builder from "./bases/Builder.ts"
import * as NamespaceDriver from "./machines/namespace/NamespaceDriver.ts"
import * as QemuDriver from "./machines/qemu/QemuDriver.ts"
import { PolicySettings } from "./network/Policy.ts"
import * as Capacity from "./registry/Capacity.ts"
import { Host, HostSettings, layerHost } from "./registry/HostSettings.ts"
import * as Registration from "./registry/Registration.ts"
import * as HostActor from "./runs/HostActor.ts"
import { RunSettings } from "./runs/RunSettings.ts"
import * as WarmPool from "./runs/WarmPool.ts"

const host = layerHost.pipe(Layer.provide(HostSettings.layerFromEnv))

// The driver the host settings chose.
const driver = Layer.unwrapEffect(
  Effect.map(Host, (h) =>
    h.driver === "qemu"
      ? QemuDriver.layer.pipe(Layer.provide(QemuDriver.QemuDriverSettings.layerFromEnv))
      : NamespaceDriver.layer.pipe(
          Layer.provide(
            Layer.merge(NamespaceDriver.NamespaceDriverSettings.layerFromEnv, PolicySettings.layerFromEnv),
          ),
        ),
  ),
)

const keyring = Keyring.layer.pipe(
  Layer.provide(Layer.merge(MasterKey.layer, WrappedKeyStore.layerStorage)),
  Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
)
const sealing = Layer.merge(SealStream.layer, Seal.layer).pipe(Layer.provide(keyring))

/** What a run's machine uses besides the host's own services. */
const runServices = Layer.mergeAll(
  Functions.layer,
  Secrets.layer,
  Links.layer.pipe(Layer.provide(Links.LinkSettings.layerFromEnv)),
  Mailbox.layer,
  RunSettings.layerFromEnv,
  TerminalSettings.layerFromEnv,
).pipe(Layer.provideMerge(sealing), Layer.provideMerge(ActorSettings.layerFromEnv))

/**
 * The host agent's layers; needs the process's NATS connection and storage. A malformed
 * `HANGAR_HOST_ID` or a first registration the bus refuses stops the role at start (as a malformed
 * setting does), so a host never runs unregistered. The host actor is released before the
 * registration, so the machines are gone before the record is.
 */
export const layer: Layer.Layer<never, never, Nats | Storage> = Layer.discard(HostActor.layer).pipe(
  // Warm machines (`runs/WarmPool.ts`): released after the host actor, before the registration.
  Layer.provideMerge(WarmPool.layer),
  Layer.provideMerge(Layer.discard(Registration.layer)),
  // Missing bases are built in the background; the host registers and runs meanwhile.
  Layer.provideMerge(Builder.layer),
  Layer.provide(Layer.mergeAll(Capacity.layer, driver, runServices)),
  Layer.provide(Layer.mergeAll(host, HostSettings.layerFromEnv, BasesSettings.layerFromEnv)),
  Layer.orDie,
)
