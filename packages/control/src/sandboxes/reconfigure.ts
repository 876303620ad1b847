import type { SandboxRecord } from "../db/entities.ts";
import { type NetworkFields, runtimeNetwork } from "./network-policy.ts";
import { bad, type OperationContext, type Outcome, reasonOf, stateChangeInProgress } from "./operation-context.ts";
import type { SandboxPatch } from "./store.ts";

// Changes to a sandbox that keep its state: its resources (resize), its network policy, and the
// attributes only the row holds (labels, public, timer intervals).

/** A sandbox's resources as stored: cores, GiB of memory, GiB of disk. */
export interface Resources {
  cpu: number;
  memory: number;
  disk: number;
}

/** cpu, memory (GiB) and disk (GiB) as asked; absent fields stay (checked by the service: each ≥ 1). */
export async function resize(c: OperationContext, organizationId: string, idOrName: string, want: Partial<Resources>): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  const op = c.operate(row.id, () => resizeChecked(c, row.id, want));
  return c.answer(row.id, op, "Sandbox failed to resize");
}

/** The reference's rules in its order, then the quota (reserved with the new size), then the host. */
async function resizeChecked(c: OperationContext, id: string, want: Partial<Resources>): Promise<Outcome> {
  const cur = await c.current(id);
  if (cur.state !== "started" && cur.state !== "stopped") throw bad("Sandbox must be in started or stopped state to resize");
  if (cur.state !== cur.desiredState) throw stateChangeInProgress();
  const next: Resources = { cpu: want.cpu ?? cur.cpu, memory: want.memory ?? cur.memory, disk: want.disk ?? cur.disk };
  if (next.cpu === cur.cpu && next.memory === cur.memory && next.disk === cur.disk) {
    throw bad("No resource changes specified - sandbox is already at the desired configuration");
  }
  const running = cur.state === "started";
  if (running && next.disk !== cur.disk) throw bad("Disk resize can only be performed on a stopped sandbox");
  if (running && next.cpu < cur.cpu) throw bad("Sandbox must be in stopped state to decrease the number of CPU cores");
  if (running && next.memory < cur.memory) throw bad("Sandbox must be in stopped state to decrease memory");
  if (next.disk < cur.disk) throw bad("Sandbox disk size cannot be decreased");
  if (cur.runnerId === null) throw bad("Sandbox has no runner assigned");
  await c.runtimeOf(cur);
  // The totals take what the resize adds (cpu and memory count only while the sandbox runs); the
  // per-sandbox limits its new size. The new size is written with `resizing`, so the room it
  // needs is held against concurrent creates and starts, and given back if the host fails.
  const added = { cpu: running ? next.cpu - cur.cpu : 0, memory: running ? next.memory - cur.memory : 0, disk: next.disk - cur.disk, gpu: 0, sandboxClass: cur.sandboxClass };
  await c.store.updateAdmitted(cur, added, { state: "resizing", ...next }, { size: { ...next, gpu: cur.gpu } });
  return driveResize(c, { ...cur, ...next, state: "resizing" }, cur);
}

/**
 * Applies the row's resources on the host, then puts the sandbox back in the state it was in
 * (`desiredState`: a resize never changes it). On failure the old resources come back when they
 * are known (`before`); after a crash they are not, and the sandbox goes to `error`.
 */
export async function driveResize(c: OperationContext, row: SandboxRecord, before?: Resources): Promise<Outcome> {
  const back = row.desiredState === "started" ? "started" : "stopped";
  try {
    await (await c.runtimeOf(row)).resize(row.id, { cpu: row.cpu, memoryGiB: row.memory, diskGiB: row.disk });
    await c.store.update(row.id, { state: back });
    c.activity.touch(row.id);
    return {};
  } catch (err) {
    if (!before) return c.fail(row.id, err);
    const reason = reasonOf(err);
    c.log(`sandbox ${row.id}: resize failed: ${reason}`);
    await c.store.update(row.id, { state: back, cpu: before.cpu, memory: before.memory, disk: before.disk });
    return { failed: reason };
  }
}

/**
 * A new network policy, pushed to the host first (at once for a sandbox running with egress; one
 * started loopback-only gets it at its next start), then persisted, as the reference does.
 */
export async function setNetwork(c: OperationContext, organizationId: string, idOrName: string, next: (current: NetworkFields) => NetworkFields): Promise<SandboxRecord> {
  c.assertOpen();
  const row = await c.store.find(organizationId, idOrName);
  const fields = next(row);
  const op = c.locks.tryRun(row.id, async () => {
    const rt = row.runnerId === null ? undefined : await c.runtimeOf(row);
    if (rt && (await rt.inspect(row.id))) await rt.setNetwork(row.id, runtimeNetwork(fields));
    await c.store.update(row.id, { networkBlockAll: fields.networkBlockAll, networkAllowList: fields.networkAllowList ?? null });
  });
  if (!op) throw stateChangeInProgress();
  await op;
  c.activity.touch(row.id);
  return c.current(row.id);
}

/** Attributes only the row holds: written at once, whatever operation runs. */
export async function update(c: OperationContext, organizationId: string, idOrName: string, patch: SandboxPatch): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, idOrName);
  await c.store.update(row.id, patch);
  c.activity.touch(row.id);
  return c.current(row.id);
}
