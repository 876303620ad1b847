import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { EntityManager, MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import {
  type Organization as OrganizationDto,
  OrganizationSchema,
  OrganizationService,
  OrganizationUsageOverviewSchema,
  OtelConfigSchema,
  RegionUsageOverviewSchema,
  SandboxIdentitySchema,
} from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { SandboxClass } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { sandboxClasses } from "../sandboxes/sandbox-class.ts";
import type { Credentials, Invalidation } from "../auth/credentials.ts";
import { authOf, callerOf } from "../call/call.ts";
import type { SecretBox } from "../auth/secret-box.ts";
import { isOperator } from "../auth/guard.ts";
import { Organization, type StoredOtelConfig } from "../db/entities.ts";
import { type Exec, execIn } from "../db/exec.ts";
import { changeAccess, deleteKeys, lockOwners } from "../organizations/access-changes.ts";
import { insertOrganization, insertRegionQuota } from "../organizations/new-organization.ts";
import { removeOrganization } from "../organizations/remove-organization.ts";
import { applyQuota, checkQuota } from "../organizations/quota.ts";
import { regionUsage } from "../organizations/usage.ts";
import { Checks } from "./validate.ts";
import { recordEvent } from "../webhooks/events.ts";

// Organizations (spec 4.3). Who may call what is declared on each RPC (owner, operator, member);
// the guard has already resolved the organization named in the path, so a handler only ever
// sees one the caller belongs to (or, on operator routes, any).

/** As the reference: a person creates at most this many organizations (the personal one included). */
const MAX_CREATED = 10;
const MASK = "******";

export function organizationService(orm: MikroORM, credentials: Credentials, box: SecretBox): Partial<ServiceImpl<typeof OrganizationService>> {
  const em = () => orm.em.fork();

  async function find(id: string, fork: EntityManager = em()): Promise<Organization> {
    const org = /^[0-9a-f-]{36}$/i.test(id) ? await fork.findOne(Organization, { id }) : null;
    if (!org) throw errors.notFound(`Organization with ID ${id} not found`);
    return org;
  }

  const changing = <T>(changes: Invalidation[], work: (exec: Exec, changes: Invalidation[]) => Promise<T>) => changeAccess(orm, credentials, changes, work);

  function otelOf(org: Organization, clear: boolean) {
    const c = org.otelConfig;
    if (!c) return undefined;
    const headers = Object.fromEntries(Object.entries(c.headers).map(([k, v]) => [k, clear ? box.open(v) : MASK]));
    return create(OtelConfigSchema, { endpoint: c.endpoint, headers, organizationId: org.id });
  }

  function toOrganization(o: Organization): OrganizationDto {
    const ts = (d: Date | null | undefined) => (d ? timestampFromDate(d) : undefined);
    return create(OrganizationSchema, {
      id: o.id,
      name: o.name,
      createdBy: o.createdBy,
      personal: o.personal,
      defaultRegionId: o.defaultRegionId ?? undefined,
      maxCpuPerSandbox: o.maxCpuPerSandbox,
      maxMemoryPerSandbox: o.maxMemoryPerSandbox,
      maxDiskPerSandbox: o.maxDiskPerSandbox,
      authenticatedRateLimit: o.authenticatedRateLimit ?? undefined,
      sandboxCreateRateLimit: o.sandboxCreateRateLimit ?? undefined,
      sandboxLifecycleRateLimit: o.sandboxLifecycleRateLimit ?? undefined,
      authenticatedRateLimitTtlSeconds: o.authenticatedRateLimitTtlSeconds ?? undefined,
      sandboxCreateRateLimitTtlSeconds: o.sandboxCreateRateLimitTtlSeconds ?? undefined,
      sandboxLifecycleRateLimitTtlSeconds: o.sandboxLifecycleRateLimitTtlSeconds ?? undefined,
      suspended: o.suspended,
      suspendedAt: ts(o.suspendedAt),
      suspensionReason: o.suspensionReason ?? undefined,
      suspendedUntil: ts(o.suspendedUntil),
      suspensionCleanupGracePeriodHours: o.suspensionCleanupGracePeriodHours,
      snapshotDeactivationTimeoutMinutes: o.snapshotDeactivationTimeoutMinutes,
      sandboxLimitedNetworkEgress: o.sandboxLimitedNetworkEgress,
      experimentalConfig: (o.experimentalConfig ?? undefined) as OrganizationDto["experimentalConfig"],
      otelConfig: otelOf(o, false),
      createdAt: timestampFromDate(o.createdAt),
      updatedAt: timestampFromDate(o.updatedAt),
    });
  }

  // The operator routes' rule: a system admin signed in, or with their full-scope key.
  const byOperator = (ctx: HandlerContext) => {
    const p = authOf(ctx).principal;
    return p !== undefined && isOperator(p);
  };

  return {
    async listOrganizations(_req, ctx) {
      const caller = callerOf(ctx);
      // A key belongs to one organization and sees only that one.
      const where = caller.apiKey ? { id: caller.apiKey.organizationId } : { id: { $in: await memberships(em(), caller.userId) } };
      const rows = await em().find(Organization, where, { orderBy: { createdAt: "asc" } });
      return { items: rows.map(toOrganization) };
    },

    async createOrganization(req, ctx) {
      const caller = callerOf(ctx);
      new Checks().displayName("name", req.name).that(req.defaultRegionId.trim() !== "", "defaultRegionId should not be empty").done();
      const id = await changing([], async (exec) => {
        // One creation per person at a time, so the limit holds under concurrent requests.
        await exec(`select pg_advisory_xact_lock(hashtext('organizations:' || ?))`, [caller.userId]);
        const [{ n }] = (await exec(`select count(*)::int as n from organization where created_by = ?`, [caller.userId])) as Array<{ n: number }>;
        if (n >= MAX_CREATED) throw errors.permissionDenied("You have reached the maximum number of created organizations");
        return insertOrganization(exec, { name: req.name.trim(), createdBy: caller.userId, personal: false, defaultRegionId: req.defaultRegionId });
      });
      return toOrganization(await find(id));
    },

    async getOrganization(req) {
      return toOrganization(await find(req.organizationId));
    },

    async deleteOrganization(req) {
      const org = await find(req.organizationId);
      if (org.personal) throw errors.permissionDenied("Cannot delete personal organization");
      await changing([], (exec, changes) => removeOrganization(exec, changes, org.id));
      return {};
    },

    async setDefaultRegion(req) {
      new Checks().that(req.defaultRegionId.trim() !== "", "defaultRegionId should not be empty").done();
      await changing([], async (exec) => {
        const rows = (await exec(`select default_region_id from organization where id = ? for update`, [req.organizationId])) as Array<{ default_region_id: string | null }>;
        if (rows[0]?.default_region_id) throw errors.alreadyExists("Organization already has a default region set");
        const region = (await exec(`select enforce_quotas from region where id = ? and region_type = 'shared'`, [req.defaultRegionId])) as Array<{ enforce_quotas: boolean }>;
        if (!region[0]) throw errors.notFound("Region not found");
        await exec(`update organization set default_region_id = ?, updated_at = now() where id = ?`, [req.defaultRegionId, req.organizationId]);
        if (region[0].enforce_quotas) await insertRegionQuota(exec, req.organizationId, req.defaultRegionId);
      });
      return {};
    },

    async getUsage(req) {
      const fork = em();
      const org = await find(req.organizationId, fork);
      const usage = await regionUsage(execIn(fork), org.id);
      const [{ volumes }] = (await execIn(fork)(`select count(*)::int as volumes from volume where organization_id = ? and state <> 'deleted'`, [org.id])) as Array<{ volumes: number }>;
      return create(OrganizationUsageOverviewSchema, {
        regionUsage: usage.map((u) =>
          create(RegionUsageOverviewSchema, {
            regionId: u.regionId,
            sandboxClass: sandboxClasses.number(u.sandboxClass) || SandboxClass.CONTAINER,
            totalCpuQuota: u.totalCpuQuota,
            currentCpuUsage: u.cpu,
            totalMemoryQuota: u.totalMemoryQuota,
            currentMemoryUsage: u.memory,
            totalDiskQuota: u.totalDiskQuota,
            currentDiskUsage: u.disk,
            totalGpuQuota: u.totalGpuQuota,
            currentGpuUsage: u.gpu,
            maxCpuPerSandbox: u.maxCpuPerSandbox ?? undefined,
            maxMemoryPerSandbox: u.maxMemoryPerSandbox ?? undefined,
            maxDiskPerSandbox: u.maxDiskPerSandbox ?? undefined,
          }),
        ),
        totalSnapshotQuota: org.snapshotQuota,
        // Snapshots are not kept per organization yet: none can count against a quota.
        currentSnapshotUsage: 0,
        totalVolumeQuota: org.volumeQuota,
        currentVolumeUsage: volumes,
      });
    },

    async updateQuota(req) {
      const { organizationId, $typeName: _t, $unknown: _u, ...fields } = req;
      checkQuota(fields);
      await find(organizationId);
      // Cached member access carries the rate-limit overrides: evict it in every process.
      await changing([{ kind: "organization", organizationId }], (exec) => applyQuota(exec, organizationId, fields));
      return toOrganization(await find(organizationId));
    },

    async listAvailableSandboxClasses(req) {
      const usage = await regionUsage(execIn(em()), req.organizationId);
      return { items: usage.map((u) => ({ regionId: u.regionId, sandboxClass: sandboxClasses.number(u.sandboxClass) || SandboxClass.CONTAINER, gpuAvailable: u.totalGpuQuota > 0, allowedGpuTypes: [] })) };
    },

    async leaveOrganization(req, ctx) {
      const caller = callerOf(ctx);
      await changing([{ kind: "member", organizationId: req.organizationId, userId: caller.userId }], async (exec, changes) => {
        const owners = await lockOwners(exec, req.organizationId);
        if (owners.length === 1 && owners[0] === caller.userId) {
          throw errors.permissionDenied(`Organization with ID ${req.organizationId} must have at least one owner`);
        }
        await deleteKeys(exec, changes, "organization_id = ? and user_id = ?", [req.organizationId, caller.userId]);
        await exec(`delete from organization_member where organization_id = ? and user_id = ?`, [req.organizationId, caller.userId]);
        await recordEvent(exec, req.organizationId, "organization.member.removed", { organizationId: req.organizationId, userId: caller.userId });
      });
      return {};
    },

    async suspendOrganization(req) {
      const until = req.until ? timestampDate(req.until) : undefined;
      new Checks()
        .that(req.reason === undefined || req.reason.length <= 1024, "reason must be shorter than or equal to 1024 characters")
        .that(until === undefined || !Number.isNaN(until.getTime()), "until must be a Date instance")
        .that(req.suspensionCleanupGracePeriodHours === undefined || req.suspensionCleanupGracePeriodHours >= 0, "suspensionCleanupGracePeriodHours must not be less than 0")
        .done();
      await find(req.organizationId);
      await changing([{ kind: "organization", organizationId: req.organizationId }], (exec) =>
        exec(
          `update organization set suspended = true, suspended_at = now(), suspension_reason = ?, suspended_until = ?,
                  suspension_cleanup_grace_period_hours = coalesce(?, suspension_cleanup_grace_period_hours), updated_at = now()
            where id = ?`,
          [req.reason || null, until ?? null, req.suspensionCleanupGracePeriodHours ?? null, req.organizationId],
        ),
      );
      return {};
    },

    async unsuspendOrganization(req) {
      await find(req.organizationId);
      await changing([{ kind: "organization", organizationId: req.organizationId }], (exec) =>
        exec(`update organization set suspended = false, suspended_at = null, suspension_reason = null, suspended_until = null, updated_at = now() where id = ?`, [
          req.organizationId,
        ]),
      );
      return {};
    },

    async getOtelConfigBySandboxAuthToken(req) {
      const rows = (await execIn(em())(`select organization_id from sandbox where auth_token = ? and state <> 'destroyed'`, [req.authToken])) as Array<{ organization_id: string }>;
      const org = rows[0] ? await em().findOne(Organization, { id: rows[0].organization_id }) : null;
      const config = org && otelOf(org, true);
      if (!config) throw errors.notFound(`Organization OTEL config with sandbox auth token ${req.authToken} not found`);
      return config;
    },

    async getSandboxIdentityBySandboxAuthToken(req) {
      const rows = (await execIn(em())(`select id, organization_id from sandbox where auth_token = ? and state <> 'destroyed'`, [req.authToken])) as Array<{
        id: string;
        organization_id: string;
      }>;
      if (!rows[0]) throw errors.notFound("Sandbox not found");
      return create(SandboxIdentitySchema, { sandboxId: rows[0].id, organizationId: rows[0].organization_id });
    },

    async getOtelConfig(req, ctx) {
      const config = otelOf(await find(req.organizationId), byOperator(ctx));
      if (!config) throw errors.notFound(`Organization OTEL config for organization ${req.organizationId} not found`);
      return config;
    },

    async setOtelConfig(req) {
      const endpoint = req.config?.endpoint.trim() ?? "";
      let valid = false;
      try {
        valid = /^https?:$/.test(new URL(endpoint).protocol);
      } catch {
        valid = false;
      }
      if (!valid) throw errors.invalidArgument("Invalid OpenTelemetry endpoint");
      const fork = em();
      const org = await find(req.organizationId, fork);
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.config?.headers ?? {})) {
        if (!k || !v) continue; // empty names and values are dropped, as the reference does
        // A masked value read back and sent again keeps what is stored.
        const kept = /^\*+$/.test(v) ? org.otelConfig?.headers[k] : undefined;
        headers[k] = kept ?? box.seal(v);
      }
      org.otelConfig = { endpoint, headers } satisfies StoredOtelConfig;
      await fork.flush();
      return {};
    },

    async deleteOtelConfig(req) {
      const fork = em();
      const org = await find(req.organizationId, fork);
      org.otelConfig = null;
      await fork.flush();
      return {};
    },

    async setExperimentalConfig(req) {
      const config = req.config ?? null;
      if (config && "otel" in config) {
        throw errors.invalidArgument("OpenTelemetry configuration has moved to a dedicated endpoint: PUT /organizations/:organizationId/otel-config");
      }
      if (config && JSON.stringify(config).length > 64 * 1024) throw errors.invalidArgument("experimental config must be smaller than 64 KiB");
      const fork = em();
      const org = await find(req.organizationId, fork);
      org.experimentalConfig = config as Record<string, unknown> | null;
      await fork.flush();
      return {};
    },
  };
}

async function memberships(fork: EntityManager, userId: string): Promise<string[]> {
  const rows = (await execIn(fork)(`select organization_id from organization_member where user_id = ?`, [userId])) as Array<{ organization_id: string }>;
  return rows.map((r) => r.organization_id);
}
