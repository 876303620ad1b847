import type { MikroORM } from "@mikro-orm/postgresql";
import { Credentials, type Invalidation } from "../auth/credentials.ts";
import { type Exec, execIn } from "../db/exec.ts";

/**
 * Changes to who may do what (memberships, roles, keys, suspension) run through here: `work` in
 * one transaction, and every control process told what changed (`changes`, to which `work` may
 * add) in that same transaction, so the next request anywhere sees it; this process evicts at once.
 */
export async function changeAccess<T>(
  orm: MikroORM,
  credentials: Credentials,
  changes: Invalidation[],
  work: (exec: Exec, changes: Invalidation[]) => Promise<T>,
): Promise<T> {
  const result = await orm.em.fork().transactional(async (tx) => {
    const exec = execIn(tx);
    const value = await work(exec, changes);
    for (const inv of changes) await Credentials.publish(exec, inv);
    return value;
  });
  for (const inv of changes) credentials.evict(inv);
  return result;
}

/** Deletes API keys inside the transaction, noting each for publication. */
export async function deleteKeys(exec: Exec, changes: Invalidation[], where: string, params: unknown[]): Promise<void> {
  const rows = (await exec(`delete from api_key where ${where} returning key_hash`, params)) as Array<{ key_hash: string }>;
  for (const r of rows) changes.push({ kind: "key", hash: r.key_hash });
}

/**
 * Locks the organization's owner rows and answers their user ids: two concurrent demotions or
 * removals then see each other, and an organization never ends up without an owner.
 */
export async function lockOwners(exec: Exec, organizationId: string): Promise<string[]> {
  const rows = (await exec(`select user_id from organization_member where organization_id = ? and role = 'owner' order by user_id for update`, [
    organizationId,
  ])) as Array<{ user_id: string }>;
  return rows.map((r) => r.user_id);
}
