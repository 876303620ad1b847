import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["packages/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // Shared fixtures (the default snapshot) are built once before any suite runs.
    globalSetup: ["test/setup/shared-fixtures.ts", "test/setup/dockerd.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Suites start real servers and processes; files run in parallel forks (vitest's default:
    // cores - 1, so one at a time on 2 cores: a whole run uses a third of such a machine; two at a
    // time halves it but still shows races between suites sharing the host's loop devices).
    pool: "forks",
  },
});
