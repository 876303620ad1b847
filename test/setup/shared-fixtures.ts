import { ensureDefaultSnapshot } from "@sandbar/runner/linux";
import { TEST_SNAPSHOT_CACHE } from "../../packages/control/src/testing/server.ts";

// Vitest global setup: the fixtures that many suites share and that take minutes to make on a new
// machine are made once, before any suite starts, so no test times its first create against a
// snapshot build (a fresh clone's first `npm test` must pass). Where they are cached this costs a
// manifest read.

export default async function setup(): Promise<void> {
  if (process.getuid?.() !== 0) return; // sandbox suites skip without root; nothing to build
  const started = Date.now();
  let building = false;
  const snapshot = await ensureDefaultSnapshot({
    dataDir: TEST_SNAPSHOT_CACHE,
    onProgress: () => {
      if (!building) console.log("test fixtures: building the default snapshot (once per machine, about two minutes)");
      building = true;
    },
  });
  if (building) console.log(`test fixtures: default snapshot (${snapshot.kind}) ready in ${Math.round((Date.now() - started) / 1000)} s`);
}
