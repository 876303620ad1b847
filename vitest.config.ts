import os from "node:os";
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["packages/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // Shared fixtures (the default snapshot) are built once before any suite runs.
    globalSetup: ["test/setup/shared-fixtures.ts", "test/setup/dockerd.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Suites start real servers and processes; files run in parallel forks, at least two at a
    // time (vitest's default, cores - 1, runs one at a time on 2 cores and leaves most of such a
    // machine idle while suites wait on sandboxes: 19 min against 11.5).
    pool: "forks",
    maxWorkers: Math.max(2, os.availableParallelism() - 1),
  },
});
