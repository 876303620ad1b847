import { rm } from "node:fs/promises";
import type { SandboxProvider } from "../provider.ts";

/**
 * A test file's teardown: destroys its sandboxes, closes the provider and removes the data dir.
 * Every step runs even when one destroy fails; the failures are thrown at the end, so a sandbox
 * that cannot be destroyed still fails the file rather than leaking quietly.
 */
export async function disposeFixture(f: { provider: SandboxProvider; dataDir: string } | undefined, ids: Iterable<string> = []): Promise<void> {
  if (!f) return;
  const failures: unknown[] = [];
  for (const id of ids) await f.provider.destroy(id).catch((err: unknown) => failures.push(err));
  await f.provider.close();
  await rm(f.dataDir, { recursive: true, force: true });
  if (failures.length) throw new AggregateError(failures, `${failures.length} sandbox(es) could not be destroyed`);
}
