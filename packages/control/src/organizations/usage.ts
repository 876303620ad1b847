import { errors } from "@sandbar/protocol";
import type { Exec } from "../db/exec.ts";

// What an organization's sandboxes take, against its quotas. CPU, memory and GPU count while a
// sandbox runs or is on its way to running; disk counts until it is archived or destroyed
// (the reference's counting rules, in this server's states). Figures come from the sandbox table
// itself, so there are no counters to drift.

const GONE = `('destroyed', 'error', 'build_failed', 'archived')`;

export interface RegionUsage {
  regionId: string;
  sandboxClass: string;
  totalCpuQuota: number;
  totalMemoryQuota: number;
  totalDiskQuota: number;
  totalGpuQuota: number;
  maxCpuPerSandbox: number | null;
  maxMemoryPerSandbox: number | null;
  maxDiskPerSandbox: number | null;
  cpu: number;
  memory: number;
  disk: number;
  gpu: number;
}

/** Usage per region quota row of the organization. */
export async function regionUsage(exec: Exec, organizationId: string, regionId?: string): Promise<RegionUsage[]> {
  const rows = (await exec(
    `select q.region_id, q.sandbox_class, q.total_cpu_quota, q.total_memory_quota, q.total_disk_quota, q.total_gpu_quota,
            q.max_cpu_per_sandbox, q.max_memory_per_sandbox, q.max_disk_per_sandbox,
            coalesce(sum(s.cpu) filter (where s.running), 0)::int as cpu,
            coalesce(sum(s.memory) filter (where s.running), 0)::int as memory,
            coalesce(sum(s.gpu) filter (where s.running), 0)::int as gpu,
            coalesce(sum(s.disk), 0)::int as disk
       from region_quota q
       left join (select region_id, sandbox_class, cpu, memory, gpu, disk, (state = 'started' or desired_state = 'started') as running
                    from sandbox where organization_id = ? and state not in ${GONE}) s on s.region_id = q.region_id and s.sandbox_class = q.sandbox_class
      where q.organization_id = ? ${regionId ? "and q.region_id = ?" : ""}
      group by q.organization_id, q.region_id, q.sandbox_class
      order by q.region_id, q.sandbox_class`,
    regionId ? [organizationId, organizationId, regionId] : [organizationId, organizationId],
  )) as Array<Record<string, number | string | null>>;
  return rows.map((r) => ({
    regionId: r.region_id as string,
    sandboxClass: r.sandbox_class as string,
    totalCpuQuota: r.total_cpu_quota as number,
    totalMemoryQuota: r.total_memory_quota as number,
    totalDiskQuota: r.total_disk_quota as number,
    totalGpuQuota: r.total_gpu_quota as number,
    maxCpuPerSandbox: r.max_cpu_per_sandbox as number | null,
    maxMemoryPerSandbox: r.max_memory_per_sandbox as number | null,
    maxDiskPerSandbox: r.max_disk_per_sandbox as number | null,
    cpu: r.cpu as number,
    memory: r.memory as number,
    disk: r.disk as number,
    gpu: r.gpu as number,
  }));
}

export interface Demand {
  cpu: number;
  memory: number;
  disk: number;
  gpu: number;
  /** The class whose quota it counts against (default container). */
  sandboxClass?: string;
}

const PER_SANDBOX = "Need higher resource limits per sandbox? Ask the operator of this server to raise the organization's quota.";
const MORE = "To run more at once, stop or archive sandboxes you are not using, or ask the operator for a higher quota.";

/**
 * Refuses a sandbox that would take the organization over its quota in the region. Runs inside the
 * transaction that creates or starts the sandbox, under a per-organization lock, so concurrent
 * requests cannot both fit in the same room.
 */
/**
 * `d` is what the sandbox would add: starting a stopped sandbox adds no disk (it holds it already).
 * `size` is the sandbox's whole size after the change, for the per-sandbox limits (default `d`; a
 * resize adds only the difference to the totals).
 */
export async function admit(exec: Exec, organizationId: string, regionId: string, d: Demand, size: Demand = d): Promise<void> {
  // The organization's lock is taken in the statement that reads its limits (one round trip):
  // limits are not usage, and the usage below is read by a later statement, so with a snapshot
  // taken after the lock is held. No row (no such region): no lock, and the request is refused.
  const rows = (await exec(
    `select o.max_cpu_per_sandbox, o.max_memory_per_sandbox, o.max_disk_per_sandbox, r.region_type, r.enforce_quotas,
            pg_advisory_xact_lock(hashtext('quota:' || o.id::text)) is null as locked
       from organization o, region r where o.id = ? and r.id = ?`,
    [organizationId, regionId],
  )) as Array<{ max_cpu_per_sandbox: number; max_memory_per_sandbox: number; max_disk_per_sandbox: number; region_type: string; enforce_quotas: boolean }>;
  const org = rows[0];
  if (!org) throw errors.notFound("Region not found");
  const sandboxClass = d.sandboxClass ?? "container";
  const usage = (await regionUsage(exec, organizationId, regionId)).find((u) => u.sandboxClass === sandboxClass);
  if (!usage && org.enforce_quotas) {
    if (org.region_type === "shared") throw errors.permissionDenied(`Region ${regionId} is not available to the organization for class ${sandboxClass}`);
    throw errors.notFound("Region not found");
  }
  const max = {
    cpu: usage?.maxCpuPerSandbox ?? org.max_cpu_per_sandbox,
    memory: usage?.maxMemoryPerSandbox ?? org.max_memory_per_sandbox,
    disk: usage?.maxDiskPerSandbox ?? org.max_disk_per_sandbox,
  };
  if (size.cpu > max.cpu) throw errors.invalidArgument(`CPU request ${size.cpu} exceeds maximum allowed per sandbox (${max.cpu}).\n${PER_SANDBOX}`);
  if (size.memory > max.memory) throw errors.invalidArgument(`Memory request ${size.memory}GB exceeds maximum allowed per sandbox (${max.memory}GB).\n${PER_SANDBOX}`);
  if (size.disk > max.disk) throw errors.invalidArgument(`Disk request ${size.disk}GB exceeds maximum allowed per sandbox (${max.disk}GB).\n${PER_SANDBOX}`);
  if (!usage) return; // a region that enforces no quota (an organization's own)
  if (usage.cpu + d.cpu > usage.totalCpuQuota) throw errors.permissionDenied(`Total CPU limit exceeded. Maximum allowed: ${usage.totalCpuQuota}.\n${MORE}`);
  if (usage.memory + d.memory > usage.totalMemoryQuota) throw errors.permissionDenied(`Total memory limit exceeded. Maximum allowed: ${usage.totalMemoryQuota}GiB.\n${MORE}`);
  if (usage.disk + d.disk > usage.totalDiskQuota) {
    throw errors.permissionDenied(`Total disk limit exceeded. Maximum allowed: ${usage.totalDiskQuota}GiB.\nConsider archiving your unused Sandboxes to free up available storage.\n${MORE}`);
  }
  if (d.gpu && usage.gpu + d.gpu > usage.totalGpuQuota) throw errors.permissionDenied(`Total GPU limit exceeded. Maximum allowed: ${usage.totalGpuQuota}.`);
}
