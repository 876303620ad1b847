import { ENV_LIMITS } from "@sandbar/protocol";
import type { SandboxRecord } from "../db/entities.ts";
import { Checks } from "../services/validate.ts";
import { ENV_KEY, mapLimits } from "./create-request.ts";
import type { OperationContext } from "./operation-context.ts";

// The 0.218 client's updateEnv (the toolbox's `POST /env`, EnvironmentService.UpdateEnv): checked
// here, told to the running agent (the toolbox's forwarder: a sandbox that is not running is a
// 400 there), then kept in the sandbox's env for its later starts (the host's record and the row),
// as a warm-pool claim gives a sandbox its env.

export interface EnvChange {
  set: Record<string, string>;
  unset: string[];
  /** Also unset every variable of the sandbox's env whose value starts with it (and that `set` does not name). */
  unsetValuePrefix?: string;
}

/** Tells the running agent (the forwarded EnvironmentService.UpdateEnv). */
export type TellAgent = () => Promise<void>;

/** POSIX names, the create's bounds on the result; problems together as one 400. */
function checkEnvChange(change: EnvChange): void {
  const checks = new Checks();
  for (const key of [...Object.keys(change.set), ...change.unset]) {
    checks.that(ENV_KEY.test(key), `env name ${JSON.stringify(key.slice(0, 64))} is invalid: use letters, digits and '_', not starting with a digit`);
  }
  checks.that(change.unset.length <= ENV_LIMITS.count, `unset must contain no more than ${ENV_LIMITS.count} elements`);
  mapLimits(checks, "set", change.set, ENV_LIMITS).done();
}

/** Updates of one sandbox's env, one after the other (each reads the env the one before wrote), per context. */
const queues = new WeakMap<OperationContext, Map<string, Promise<unknown>>>();

export async function updateEnv(c: OperationContext, organizationId: string, idOrName: string, change: EnvChange, tell: TellAgent): Promise<SandboxRecord> {
  checkEnvChange(change);
  const { id } = await c.store.find(organizationId, idOrName);
  const queue = queues.get(c) ?? new Map<string, Promise<unknown>>();
  queues.set(c, queue);
  const turn = (queue.get(id) ?? Promise.resolve()).catch(() => undefined).then(() => apply(c, organizationId, id, change, tell));
  queue.set(id, turn);
  try {
    return await turn;
  } finally {
    if (queue.get(id) === turn) queue.delete(id);
  }
}

async function apply(c: OperationContext, organizationId: string, id: string, change: EnvChange, tell: TellAgent): Promise<SandboxRecord> {
  const row = await c.store.find(organizationId, id);
  const prefix = change.unsetValuePrefix;
  const unset = [...new Set([...change.unset, ...(prefix ? Object.keys(row.env).filter((k) => row.env[k]?.startsWith(prefix) && !(k in change.set)) : [])])];
  const env = { ...row.env };
  for (const k of unset) delete env[k];
  Object.assign(env, change.set);
  mapLimits(new Checks(), "env", env, ENV_LIMITS).done();
  await tell();
  await (await c.runtimeOf(row)).setEnv(row.id, env);
  await c.store.update(row.id, { env });
  c.activity.touch(row.id);
  return { ...row, env };
}
