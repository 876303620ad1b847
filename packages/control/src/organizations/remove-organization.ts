import { errors } from "@sandbar/protocol";
import type { Invalidation } from "../auth/credentials.ts";
import type { Exec } from "../db/exec.ts";
import { deleteKeys } from "./access-changes.ts";

/**
 * Removes an organization inside the caller's transaction (run through changeAccess): refused
 * (409) while it holds sandboxes that are not destroyed; its API keys are deleted and noted for
 * every process to forget; destroyed sandbox rows, and whatever else it owns by foreign key
 * (members, roles, invitations, volumes, registries, webhooks...), go with it. `what` names it
 * in the refusal.
 */
export async function removeOrganization(exec: Exec, changes: Invalidation[], organizationId: string, what = `Organization with ID ${organizationId}`): Promise<void> {
  await exec(`select id from organization where id = ? for update`, [organizationId]);
  const [{ n }] = (await exec(`select count(*)::int as n from sandbox where organization_id = ? and state <> 'destroyed'`, [organizationId])) as Array<{ n: number }>;
  if (n > 0) throw errors.failedPrecondition(`${what} still has ${n} sandbox${n === 1 ? "" : "es"}: delete them first`);
  await deleteKeys(exec, changes, "organization_id = ?", [organizationId]);
  // Destroyed sandbox rows go with it (they are kept only for the reads of a grace period).
  await exec(`delete from sandbox where organization_id = ?`, [organizationId]);
  await exec(`delete from organization where id = ?`, [organizationId]);
  changes.push({ kind: "organization", organizationId });
}
