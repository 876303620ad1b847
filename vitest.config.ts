import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["packages/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // Shared fixtures (the default snapshot) are built once before any suite runs.
    globalSetup: ["test/setup/shared-fixtures.ts", "test/setup/dockerd.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Suites start real servers and processes; files run in parallel forks. They mostly wait
    // (sandboxes starting, servers answering): a whole run used a third of a 2-core machine with
    // vitest's default of cores - 1 workers, so two files run at a time wherever there are fewer cores.
    pool: "forks",
    maxWorkers: Math.max(2, availableParallelism() - 1),
  },
});
