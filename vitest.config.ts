import { defineConfig } from "vitest/config"

// Test files run in forked processes (each gets its own nats-server from test/harness/).
// Heavy cases (large streams, real machines under emulation) live in files named *.heavy.test.ts;
// they are part of `npm test` and run in the same single pass.
export default defineConfig({
  test: {
    include: ["**/*.test.ts"],
    exclude: ["node_modules/**", ".tools/**", ".data/**"],
    pool: "forks",
    // Two forks, each running file after file without a fresh module registry: a file's imports
    // (effect, the NATS client, the roles) are loaded once per fork, not once per file (collect
    // took 291 s of a 1,433 s run; on 30 small files, 44 s against 22 s). Files share nothing
    // else: each starts its own nats-server and stack with its own storage prefix, and the one
    // that changes the environment puts it back.
    poolOptions: { forks: { maxForks: 2, minForks: 1, isolate: false } },
    // Runs before every file, in its fork: what a harness module undoes after each file.
    setupFiles: ["test/harness/setup.ts"],
    testTimeout: 60_000,
    // A file's stack closes every role (up to 30 s each when a role hangs) on a loaded machine.
    hookTimeout: 120_000,
    reporters: ["default"],
    // No machine made by a test (in the test process or in a role it starts) has a way to a real
    // network: a deployed host agent lets machines out by the host's default route, tests never.
    // Many 16 GiB machines share a small CI disk (see testDriverSettings).
    env: {
      HANGAR_MACHINE_UPLINKS: "none",
      HANGAR_MACHINE_MASQUERADE: "false",
      HANGAR_MACHINE_DISK_OVERCOMMIT: "16",
      // Host agents in tests offer the slim test base (quick to build, no display); the full
      // bases are offered only where a test asks for them.
      HANGAR_BASES: "debian-bookworm-slim",
    },
  },
})
