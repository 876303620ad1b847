import { errors } from "@sandbar/protocol";
import type { Exec } from "../db/exec.ts";

/** Quota fields an operator may set (UpdateQuota, a new user's personal organization), by column. */
const ORGANIZATION_COLUMNS = {
  maxCpuPerSandbox: "max_cpu_per_sandbox",
  maxMemoryPerSandbox: "max_memory_per_sandbox",
  maxDiskPerSandbox: "max_disk_per_sandbox",
  snapshotQuota: "snapshot_quota",
  maxSnapshotSize: "max_snapshot_size",
  volumeQuota: "volume_quota",
  authenticatedRateLimit: "authenticated_rate_limit",
  sandboxCreateRateLimit: "sandbox_create_rate_limit",
  sandboxLifecycleRateLimit: "sandbox_lifecycle_rate_limit",
  authenticatedRateLimitTtlSeconds: "authenticated_rate_limit_ttl_seconds",
  sandboxCreateRateLimitTtlSeconds: "sandbox_create_rate_limit_ttl_seconds",
  sandboxLifecycleRateLimitTtlSeconds: "sandbox_lifecycle_rate_limit_ttl_seconds",
  snapshotDeactivationTimeoutMinutes: "snapshot_deactivation_timeout_minutes",
} as const;
/** Totals live on the region quota of the organization's default region (the earlier set kept them on the organization). */
const REGION_COLUMNS = { totalCpuQuota: "total_cpu_quota", totalMemoryQuota: "total_memory_quota", totalDiskQuota: "total_disk_quota" } as const;

export type QuotaFields = Partial<Record<keyof typeof ORGANIZATION_COLUMNS | keyof typeof REGION_COLUMNS, number>>;

/** 400 unless every given figure is a whole number >= 0 (a negative quota would lock the organization out). */
export function checkQuota(q: QuotaFields): void {
  const bad = Object.entries(q).filter(([, v]) => v !== undefined && (!Number.isInteger(v) || v < 0)).map(([k]) => k);
  if (bad.length) throw errors.invalidArgument(bad.map((k) => `${k} must not be less than 0`).join(", "));
}

/** Sets the given figures; absent ones keep their value (as the reference, null cannot clear one). */
export async function applyQuota(exec: Exec, organizationId: string, q: QuotaFields): Promise<void> {
  checkQuota(q);
  const set = (columns: Record<string, string>) => Object.entries(columns).filter(([k]) => q[k as keyof QuotaFields] !== undefined);
  const org = set(ORGANIZATION_COLUMNS);
  if (org.length) {
    await exec(`update organization set ${org.map(([, c]) => `${c} = ?`).join(", ")}, updated_at = now() where id = ?`, [
      ...org.map(([k]) => q[k as keyof QuotaFields]),
      organizationId,
    ]);
  }
  const region = set(REGION_COLUMNS);
  if (region.length) {
    const rows = (await exec(`select default_region_id from organization where id = ?`, [organizationId])) as Array<{ default_region_id: string | null }>;
    const regionId = rows[0]?.default_region_id;
    if (!regionId) throw errors.invalidArgument("The organization has no default region to hold total quotas: set one first");
    await exec(
      `insert into region_quota (organization_id, region_id, ${region.map(([, c]) => c).join(", ")})
       values (?, ?, ${region.map(() => "?").join(", ")})
       on conflict (organization_id, region_id, sandbox_class) do update set ${region.map(([, c]) => `${c} = excluded.${c}`).join(", ")}`,
      [organizationId, regionId, ...region.map(([k]) => q[k as keyof QuotaFields])],
    );
  }
}
