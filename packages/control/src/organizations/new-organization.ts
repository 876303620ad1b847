import { randomUUID } from "node:crypto";
import { errors } from "@sandbar/protocol";
import type { Exec } from "../db/exec.ts";
import { LOCAL_REGION_ID, OPERATOR_QUOTA } from "../db/migrations/0006-organizations.ts";


export interface NewOrganization {
  name: string;
  createdBy: string;
  personal: boolean;
  /** A shared region; default: the local one. */
  defaultRegionId?: string;
  /** The operator's own organization: totals bounded by the host, not a tier. */
  operator?: boolean;
}

/**
 * Every organization is made here, whoever asks (sign-up, the operator's user create, POST
 * /organizations, bootstrap): the row, its creator as owner, and a quota in its default region
 * when that region enforces quotas. Call inside the transaction that needs it.
 */
export async function insertOrganization(exec: Exec, o: NewOrganization): Promise<string> {
  const regionId = o.defaultRegionId ?? LOCAL_REGION_ID;
  const regions = (await exec(`select enforce_quotas from region where id = ? and region_type = 'shared'`, [regionId])) as Array<{ enforce_quotas: boolean }>;
  if (!regions[0]) throw errors.notFound("Region not found");
  const id = randomUUID();
  await exec(`insert into organization (id, name, personal, created_by, default_region_id) values (?, ?, ?, ?, ?)`, [id, o.name, o.personal, o.createdBy, regionId]);
  await exec(`insert into organization_member (organization_id, user_id, role) values (?, ?, 'owner')`, [id, o.createdBy]);
  if (regions[0].enforce_quotas) await insertRegionQuota(exec, id, regionId, o.operator);
  return id;
}

/** The default quota of an organization in a region (the reference's defaults), or the operator's. */
export async function insertRegionQuota(exec: Exec, organizationId: string, regionId: string, operator = false): Promise<void> {
  const totals = operator ? [OPERATOR_QUOTA, OPERATOR_QUOTA, OPERATOR_QUOTA] : [10, 10, 30];
  await exec(
    `insert into region_quota (organization_id, region_id, total_cpu_quota, total_memory_quota, total_disk_quota)
     values (?, ?, ?, ?, ?) on conflict do nothing`,
    [organizationId, regionId, ...totals],
  );
}
