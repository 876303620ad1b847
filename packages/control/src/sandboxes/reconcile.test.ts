import { stat } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { reconcile } from "./reconcile.ts";
import { sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";

// Reconciliation finishing each kind of operation a crash can interrupt. The database is set
// to what a crash mid-operation leaves, then reconcile() runs as it does at server start.

let f: SandboxFixture;
beforeAll(async () => {
  f = await sandboxFixture();
});
afterAll(() => f?.stop());

it("finishes interrupted archives, restores, deletes, starts and creates, and drops stray host sandboxes", async () => {
  const archiving = await f.create();
  await f.exec(archiving.id, "echo a > ~/f");
  await f.call("POST", `/sandbox/${archiving.id}/stop`);
  await f.manager.store.update(archiving.id, { desiredState: "archived" });

  const restoring = await f.create();
  await f.exec(restoring.id, "echo r > ~/f");
  await f.call("POST", `/sandbox/${restoring.id}/stop`);
  await f.call("POST", `/sandbox/${restoring.id}/archive`);
  await f.manager.store.update(restoring.id, { state: "restoring", desiredState: "started", runnerId: f.runtime.runnerId });

  const deleting = await f.create();
  await f.manager.store.update(deleting.id, { desiredState: "destroyed", name: `DESTROYED_x_${Date.now()}` });
  const { hostUid } = await f.runtime.provider.inspect(deleting.id);

  const starting = await f.create();
  await f.exec(starting.id, "echo s > ~/f");
  await f.call("POST", `/sandbox/${starting.id}/stop`);
  await f.manager.store.update(starting.id, { desiredState: "started", backupState: "InProgress" });

  const creating = await f.create();
  await f.runtime.destroy(creating.id); // the host never got it
  await f.manager.store.update(creating.id, { state: "unknown" });

  const stray = "6f1d2c3b-0000-4000-8000-000000000001";
  await f.runtime.create({ id: stray, cpu: 1, memoryGiB: 0.5, diskGiB: 1, env: {}, user: "sandbar" });

  const report = await reconcile(f.manager);
  expect(report.removed).toEqual([stray]);
  expect(report.failed).toEqual([]);
  expect(report.resumed.sort()).toEqual([archiving.id, restoring.id, deleting.id, starting.id, creating.id].sort());

  const state = async (id: string) => (await f.manager.store.byId(id))!;
  expect((await state(archiving.id)).state).toBe("archived");
  await stat(path.join(f.t.dataDir, "archives", `${archiving.id}.tar`));
  expect(await f.runtime.inspect(archiving.id)).toBeUndefined();

  expect((await state(restoring.id)).state).toBe("started");
  expect((await f.exec(restoring.id, "cat ~/f")).result).toBe("r\n");

  expect((await state(deleting.id)).state).toBe("destroyed");
  expect(await f.runtime.inspect(deleting.id)).toBeUndefined();
  expect(hostUid).toBeGreaterThan(0);

  expect(await state(starting.id)).toMatchObject({ state: "started", backupState: "Error" });
  expect((await f.exec(starting.id, "cat ~/f")).result).toBe("s\n");

  expect((await state(creating.id)).state).toBe("started");
  expect(await f.runtime.inspect(stray)).toBeUndefined();

  // A second pass finds nothing to do.
  const again = await reconcile(f.manager);
  expect(again.resumed).toEqual([]);
  expect(again.removed).toEqual([]);
});
