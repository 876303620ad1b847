/** A `runner` row as SQL answers it (see migration 0018). */
export interface RunnerRow {
  id: string;
  organization_id: string | null;
  region_id: string;
  name: string;
  api_url: string | null;
  credential_sealed: string;
  tags: string[];
  cpu: number;
  memory_gib: number;
  disk_gib: number;
  gpu: number | null;
  gpu_type: string | null;
  sandbox_class: string;
  cpu_usage: number;
  memory_usage: number;
  disk_usage: number;
  started_sandboxes: number;
  snapshot_count: number;
  /** The id the runner process reports (kept in its data dir): what sandboxes record as their runner. */
  runner_key: string | null;
  app_version: string | null;
  state: "initializing" | "ready" | "disabled" | "decommissioned" | "unresponsive";
  state_reason: string | null;
  unschedulable: boolean;
  draining: boolean;
  last_checked: Date | string | null;
  created_at: Date | string;
  updated_at: Date | string;
  /** With ALLOCATED: what its sandboxes hold (all but archived and destroyed ones), as placement counts it. */
  allocated_cpu?: number;
  allocated_memory?: number;
  allocated_disk?: number;
  allocated_gpu?: number;
}

export const RUNNER_COLUMNS =
  "id, organization_id, region_id, name, api_url, credential_sealed, tags, cpu, memory_gib, disk_gib, gpu, gpu_type, sandbox_class, cpu_usage, memory_usage, disk_usage, started_sandboxes, snapshot_count, runner_key, app_version, state, state_reason, unschedulable, draining, last_checked, created_at, updated_at";

/** The runner's allocation, for a `select … from runner`: the same sums placement (directory.ts) compares with its capacity. */
export const ALLOCATED = ["cpu", "memory", "disk", "gpu"]
  .map((c) => `(select coalesce(sum(s.${c}), 0) from sandbox s where s.runner_id = runner.runner_key and s.state not in ('archived', 'destroyed'))::float8 as allocated_${c}`)
  .join(", ");
