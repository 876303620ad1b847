import { mkdtemp } from "node:fs/promises";
import path from "node:path";
import type { TestProject } from "vitest/node";
import { stopDockerd } from "../../packages/runner/src/docker/testing/dockerd.ts";

// Vitest global setup: names the directory of the run's shared Docker engine. Nothing starts
// here: the first suite that needs the engine starts it (sharedDockerd), so runs without Docker
// suites pay nothing; the teardown stops it if one was started.

declare module "vitest" {
  export interface ProvidedContext {
    dockerdDir: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = await mkdtemp(path.join("/var/tmp", "sandbar-test-dockerd-"));
  project.provide("dockerdDir", dir);
  return () => stopDockerd(dir);
}
