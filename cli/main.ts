/**
 * The `hangar` command. Users' commands (`cli/user/`) talk to the HTTP API only; operators use
 * `serve` and `admin`, which load the service itself. Each is loaded only when asked for, so a
 * user's command never loads the roles.
 *
 *   hangar serve gateway|relay|actors|host-agent   one role, connecting to HANGAR_NATS_URL
 *   hangar serve all                               local nats-server + every role (npm start)
 *   hangar admin …                                 operator commands (cli/admin.ts)
 *   hangar COMMAND …                               the spec's CLI (cli/user/main.ts)
 *
 * Exit status: 0 worked, 1 run failed, 2 wrong command, 3 API refused, 4 anything else.
 */

const serve = async (role: string | undefined) => {
  const [{ Effect, Layer }, Log, { runMain }] = await Promise.all([
    import("effect"),
    import("../core/Log.ts"),
    import("../core/Main.ts"),
  ])
  if (role === "all") {
    const Local = await import("../deploy/Local.ts")
    return runMain(Layer.launch(Local.layer).pipe(Effect.provide(Log.layer)))
  }
  const roles = {
    gateway: () => import("../gateway/main.ts"),
    relay: () => import("../relay/main.ts"),
    actors: () => import("../actors/main.ts"),
    "host-agent": () => import("../host-agent/main.ts"),
  } as const
  if (role === undefined || !(role in roles)) {
    process.stderr.write(
      `unknown role: ${role ?? "(none)"}\nusage: hangar serve gateway|relay|actors|host-agent|all\n`,
    )
    return process.exit(2)
  }
  const [{ layer }, Connected] = await Promise.all([
    roles[role as keyof typeof roles](),
    import("../core/Connected.ts"),
  ])
  return runMain(
    Layer.launch(layer.pipe(Layer.provide(Connected.roleLayerFromEnv))).pipe(Effect.provide(Log.layer)),
  )
}

const [command, ...rest] = process.argv.slice(2)
if (command === "serve") await serve(rest[0])
else if (command === "admin") (await import("./admin.ts")).main(rest)
else {
  const status = await (await import("./user/main.ts")).main(process.argv.slice(2))
  process.stdout.write("", () => process.exit(status))
}
