import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["packages/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // Shared fixtures (the default snapshot) are built once before any suite runs.
    globalSetup: ["test/setup/shared-fixtures.ts", "test/setup/dockerd.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Suites start real servers and processes; files run in parallel forks.
    pool: "forks",
  },
});
