import { randomBytes, randomUUID } from "node:crypto";
import type { SandboxRecord } from "../db/entities.ts";
import { softDelete } from "./archive-delete.ts";
import { newAuthToken } from "./auth-token.ts";
import { driveCreate } from "./create.ts";
import { capture, planCapture } from "./layer-capture.ts";
import { bad, type OperationContext, type Outcome, reasonOf, stateChangeInProgress } from "./operation-context.ts";
import { checkCapturable } from "./snapshot-sandbox.ts";

// Forks (0.218 `fork`, and Sandbar's N forks sharing one capture): new sandboxes standing on the
// parent's layers and its writable layer captured at this instant, copy-on-write, each with its
// own id, name, preview token and quota share (env, labels, network and shape copied). Their rows
// are admitted first (quota, names), so a refusal costs no copy; then the parent's writable layer
// is captured (the parent reads `forking` meanwhile and runs on), then each fork is made on the
// parent's runner and started (a stopped parent's fork too: the reference's client waits for it).

/** Forks one call makes at most. */
export const MAX_FORKS = 10;

export async function fork(c: OperationContext, organizationId: string, idOrName: string, names: Array<string | undefined>): Promise<SandboxRecord[]> {
  c.assertOpen();
  if (names.length < 1 || names.length > MAX_FORKS) throw bad(`count must be between 1 and ${MAX_FORKS}`);
  const parent = await c.store.find(organizationId, idOrName);
  if (c.locks.busy(parent.id)) throw stateChangeInProgress();
  checkCapturable(parent, "fork");
  let made: SandboxRecord[] = [];
  const op = c.operate(parent.id, async (): Promise<Outcome> => {
    const cur = await c.current(parent.id);
    checkCapturable(cur, "fork");
    const rt = await c.runtimeOf(cur);
    const plan = planCapture(cur);
    const forks = names.map((name) => forkRow(cur, name, plan.layers));
    // Admitted one by one (quota, unique names); a refusal takes back those admitted before it.
    const admitted: SandboxRecord[] = [];
    try {
      for (const f of forks) {
        await c.store.insert(f);
        admitted.push(f);
      }
    } catch (err) {
      await Promise.all(admitted.map((f) => discard(c, f)));
      throw err;
    }
    await c.store.update(cur.id, { state: "forking" });
    try {
      await capture(rt, cur.id, plan);
    } catch (err) {
      c.log(`sandbox ${cur.id}: fork failed: ${reasonOf(err)}`);
      await Promise.all(forks.map((f) => discard(c, f)));
      return { failed: reasonOf(err) };
    } finally {
      await c.store.update(cur.id, { state: cur.state });
    }
    c.activity.touch(cur.id);
    // Made and started at once, a stopped parent's too: the 0.218 client's fork() waits for `started`.
    await Promise.all(forks.map((f) => driveCreate(c, f)));
    made = forks;
    return {};
  });
  const outcome = await op;
  if (outcome.failed !== undefined) throw bad(`Sandbox fork failed: ${outcome.failed}`);
  return Promise.all(made.map((f) => c.current(f.id)));
}

/** A fork's row: the parent's shape, env, labels, network and image; its own identity; the captured stack. */
function forkRow(parent: SandboxRecord, name: string | undefined, layers: string[]): SandboxRecord {
  const now = new Date();
  const id = randomUUID();
  return {
    ...parent,
    id,
    name: name ?? `${parent.name.slice(0, 40)}-fork-${randomBytes(4).toString("hex")}`,
    env: { ...parent.env },
    labels: { ...parent.labels },
    state: "unknown",
    desiredState: "started",
    errorReason: null,
    backupState: "None",
    backupCreatedAt: null,
    createdAt: now,
    updatedAt: now,
    lastActivityAt: now,
    authToken: newAuthToken(),
    // Its own signing key (made on first read): the parent's rotation must not be the fork's, nor
    // the fork's the parent's. It claimed no pool and has no error to recover. The parent's TTL
    // (autoDestroyAt) carries over: a fork of a sandbox meant to go does not outlive it unasked.
    signingKeySealed: null,
    warmPoolId: null,
    recoverable: false,
    layers,
    parentId: parent.id,
    buildInfo: null,
  };
}

/** A fork that will not be made: gone as a delete leaves a sandbox (its name freed). */
async function discard(c: OperationContext, f: SandboxRecord): Promise<void> {
  await softDelete(c, f).catch(() => undefined);
  await c.store.update(f.id, { state: "destroyed", runnerId: null }).catch(() => undefined);
}
