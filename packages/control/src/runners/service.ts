import { randomBytes, randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { EntityManager, MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { type Runner, RunnerSchema, type RunnerService, RunnerState } from "@sandbar/protocol/gen/sandbar/control/v1/runner_pb.js";
import { SandboxClass } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import type { SecretBox } from "../auth/secret-box.ts";
import { organizationOf } from "../call/call.ts";
import { execIn } from "../db/exec.ts";
import { DEFAULT_CLASS, gpuTypes, sandboxClasses } from "../sandboxes/sandbox-class.ts";
import { Checks } from "../services/validate.ts";
import { ALLOCATED, type RunnerRow, RUNNER_COLUMNS } from "./rows.ts";

// The runners API (reference: /runners, and the earlier /nodes): an organization registers the
// runners of its custom regions, each with the address control reaches it at (`apiUrl`) and a
// credential answered once. Control presents that credential to the runner, so it is kept
// sealed with the SecretBox, never in clear and never in an answer after the create. Another
// organization's runner, and a runner of a shared region, is "Runner not found".

const NAME = /^[a-zA-Z0-9_.-]+$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const STATES: Record<string, RunnerState> = {
  initializing: RunnerState.INITIALIZING,
  ready: RunnerState.READY,
  disabled: RunnerState.DISABLED,
  decommissioned: RunnerState.DECOMMISSIONED,
  unresponsive: RunnerState.UNRESPONSIVE,
};
/** A runner credential: told apart from API keys (`sbr_`) at a glance. */
const CREDENTIAL_PREFIX = "sbrn_";

export function runnerService(orm: MikroORM, box: SecretBox): Partial<ServiceImpl<typeof RunnerService>> {
  const em = () => orm.em.fork();

  async function own(organizationId: string, id: string, tx: EntityManager = em()): Promise<RunnerRow> {
    if (!UUID.test(id)) throw errors.notFound("Runner not found");
    const rows = (await execIn(tx)(`select ${RUNNER_COLUMNS}, ${ALLOCATED} from runner where id = ? and organization_id = ?`, [id, organizationId])) as RunnerRow[];
    if (!rows[0]) throw errors.notFound("Runner not found");
    return rows[0];
  }

  /** The organization's own custom region by id (or, for /nodes, by name). */
  async function customRegion(organizationId: string, idOrName: string, tx: EntityManager): Promise<string> {
    const rows = (await execIn(tx)(`select id, organization_id, region_type from region where id = ? or (name = ? and organization_id = ?)`, [idOrName, idOrName, organizationId])) as Array<{
      id: string;
      organization_id: string | null;
      region_type: string;
    }>;
    const mine = rows.find((r) => r.organization_id === organizationId);
    if (mine) return mine.id;
    // A shared region exists for everyone: saying so leaks nothing; another organization's region does not exist here.
    if (rows.some((r) => r.region_type === "shared" || r.region_type === "dedicated")) throw errors.permissionDenied("Runner can only be created in a custom region");
    throw errors.notFound("Region not found");
  }

  async function update(organizationId: string, id: string, column: "unschedulable" | "draining", value: boolean): Promise<Runner> {
    return em().transactional(async (tx) => {
      await own(organizationId, id, tx);
      await execIn(tx)(`update runner set ${column} = ?, updated_at = now() where id = ?`, [value, id]);
      return toRunner(await own(organizationId, id, tx));
    });
  }

  return {
    async createRunner(req, ctx) {
      const organizationId = organizationOf(ctx);
      const name = (req.name ?? "").trim();
      const regionRef = req.regionId || req.region || "";
      const checks = new Checks();
      checks.that(regionRef !== "", "regionId should not be empty");
      checks.that(NAME.test(name), "Runner name must contain only letters, numbers, underscores, periods, and hyphens");
      checks.that(name.length >= 3 && name.length <= 255, "Runner name must be between 3 and 255 characters");
      checks.that(req.tags.length <= 50 && req.tags.every((t) => t.length > 0 && t.length <= 64), "tags must be at most 50 strings of 1 to 64 characters");
      if (req.apiUrl !== undefined) checks.that(isHttpUrl(req.apiUrl), "apiUrl must be an http(s) URL");
      for (const [field, v] of [["cpu", req.cpu], ["memory", req.memory], ["disk", req.disk], ["gpu", req.gpu]] as const) {
        if (v !== undefined) checks.that(Number.isInteger(v) && v >= 0 && v <= 1_000_000, `${field} must be a whole number from 0 to 1000000`);
      }
      // Without GPUs the type means nothing: any string, ignored (the reference's node DTO sends "none").
      if (req.gpu && req.gpuType !== undefined) checks.that(gpuTypes.names.includes(req.gpuType), `gpuType must be one of the following values: ${gpuTypes.names.join(", ")}`);
      // Android sandboxes go to container runners (the reference's rule): no runner is of class android.
      checks.that(req.sandboxClass !== SandboxClass.ANDROID, "sandboxClass must be one of the following values: container, linux-vm, windows");
      checks.done();
      const sandboxClass = req.sandboxClass ? (sandboxClasses.name(req.sandboxClass) ?? DEFAULT_CLASS) : DEFAULT_CLASS;
      const credential = CREDENTIAL_PREFIX + randomBytes(32).toString("hex");
      const id = randomUUID();
      await em().transactional(async (tx) => {
        const regionId = await customRegion(organizationId, regionRef, tx);
        const exec = execIn(tx);
        const taken = (await exec(`select 1 from runner where region_id = ? and name = ?`, [regionId, name])) as unknown[];
        if (taken.length) throw errors.alreadyExists(`Runner with name ${name} already exists in this region`);
        try {
          await exec(
            `insert into runner (id, organization_id, region_id, name, api_url, credential_sealed, tags, cpu, memory_gib, disk_gib, gpu, gpu_type, sandbox_class)
             values (?, ?, ?, ?, ?, ?, ?::jsonb, ?, ?, ?, ?, ?, ?)`,
            [id, organizationId, regionId, name, req.apiUrl?.replace(/\/+$/, "") ?? null, box.seal(credential), JSON.stringify(req.tags), req.cpu ?? 0, req.memory ?? 0, req.disk ?? 0, req.gpu ?? null, req.gpu ? (req.gpuType ?? null) : null, sandboxClass],
          );
        } catch (err) {
          if ((err as { code?: string }).code === "23505" || /unique/i.test(String(err))) throw errors.alreadyExists(`Runner with name ${name} already exists in this region`);
          throw err;
        }
      });
      return { id, apiKey: credential };
    },

    async listRunners(req, ctx) {
      const organizationId = organizationOf(ctx);
      const fork = em();
      const params: unknown[] = [organizationId];
      let filter = "";
      if (req.regionId !== undefined) {
        const rows = (await execIn(fork)(`select organization_id, region_type from region where id = ?`, [req.regionId])) as Array<{ organization_id: string | null; region_type: string }>;
        const region = rows[0];
        if (region && region.region_type !== "custom") throw errors.permissionDenied("Filtering by region ID is only supported for custom regions");
        if (!region || region.organization_id !== organizationId) throw errors.notFound("Region not found");
        filter = " and region_id = ?";
        params.push(req.regionId);
      }
      const rows = (await execIn(fork)(`select ${RUNNER_COLUMNS}, ${ALLOCATED} from runner where organization_id = ?${filter} order by created_at, id`, params)) as RunnerRow[];
      return { items: rows.map(toRunner) };
    },

    async getRunner(req, ctx) {
      return toRunner(await own(organizationOf(ctx), req.id));
    },

    updateRunnerScheduling: (req, ctx) => update(organizationOf(ctx), req.id, "unschedulable", req.unschedulable),

    updateRunnerDraining: (req, ctx) => update(organizationOf(ctx), req.id, "draining", req.draining),

    async deleteRunner(req, ctx) {
      const organizationId = organizationOf(ctx);
      await em().transactional(async (tx) => {
        const runner = await own(organizationId, req.id, tx);
        // The reference's rules: out of scheduling first, and nothing left on it but archives.
        if (!runner.unschedulable) throw errors.invalidArgument("Cannot delete runner which is available for scheduling sandboxes");
        const exec = execIn(tx);
        const held = (await exec(`select 1 from sandbox where runner_id = ? and state not in ('archived', 'destroyed') limit 1`, [runner.runner_key ?? runner.id])) as unknown[];
        if (held.length) throw errors.invalidArgument("Cannot delete runner which has sandboxes associated with it");
        await exec(`delete from runner where id = ?`, [runner.id]);
      });
      return {};
    },
  };
}

function isHttpUrl(v: string): boolean {
  try {
    return /^https?:$/.test(new URL(v).protocol) && v.length <= 2048;
  } catch {
    return false;
  }
}

/** The reference's availability score: 100 for an idle runner, down with its busiest resource. */
function availability(r: RunnerRow): number {
  if (r.state !== "ready") return 0;
  return Math.max(0, Math.round(100 - Math.max(r.cpu_usage, r.memory_usage, r.disk_usage)));
}

function toRunner(r: RunnerRow): Runner {
  return create(RunnerSchema, {
    id: r.id,
    ...(r.api_url ? { apiUrl: r.api_url } : {}),
    cpu: r.cpu,
    memory: r.memory_gib,
    disk: r.disk_gib,
    ...(r.gpu !== null ? { gpu: r.gpu } : {}),
    ...(r.gpu_type ? { gpuType: r.gpu_type } : {}),
    sandboxClass: sandboxClasses.number(r.sandbox_class) || SandboxClass.CONTAINER,
    currentCpuUsagePercentage: r.cpu_usage,
    currentMemoryUsagePercentage: r.memory_usage,
    currentDiskUsagePercentage: r.disk_usage,
    currentAllocatedCpu: r.allocated_cpu ?? 0,
    currentAllocatedMemoryGib: r.allocated_memory ?? 0,
    currentAllocatedDiskGib: r.allocated_disk ?? 0,
    currentStartedSandboxes: r.started_sandboxes,
    currentSnapshotCount: r.snapshot_count,
    availabilityScore: availability(r),
    region: r.region_id,
    name: r.name,
    state: STATES[r.state] ?? RunnerState.UNSPECIFIED,
    ...(r.last_checked ? { lastChecked: timestampFromDate(new Date(r.last_checked)) } : {}),
    unschedulable: r.unschedulable,
    draining: r.draining,
    tags: r.tags,
    createdAt: timestampFromDate(new Date(r.created_at)),
    updatedAt: timestampFromDate(new Date(r.updated_at)),
    version: "0",
    apiVersion: "0",
    runnerClass: "container",
    ...(r.app_version ? { appVersion: r.app_version } : {}),
  });
}
