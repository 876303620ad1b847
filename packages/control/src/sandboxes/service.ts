import type { ServiceImpl } from "@connectrpc/connect";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { MikroORM } from "@mikro-orm/postgresql";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import {
  type SandboxService,
  SandboxListSortField,
  SandboxSortField,
  SortOrder,
  SandboxClassSchema,
  type ResizeSandboxRequest,
} from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { organizationOf } from "../call/call.ts";
import { Checks } from "../services/validate.ts";
import type { Settings } from "../settings.ts";
import { enumCodec, sandboxStates, toHealth, toSandbox, type DtoContext } from "./dto.ts";
import type { SandboxRecord } from "../db/entities.ts";
import { checkLimit, type CursorSort, cursorPage, encodeCursor, type ListCriteria, pagePage, type PageSort, sortValueOf, whereOf } from "./list-query.ts";
import { SandboxManager } from "./manager.ts";
import type { ImageSource, RunnerDirectory } from "./runner-directory.ts";
import type { SnapshotPush } from "./operation-context.ts";
import type { SandboxRuntime } from "./runtime.ts";
import type { WarmPools } from "./warm-pools.ts";
import { isEphemeral, normalizeAutoArchive } from "./states.ts";
import { DEFAULT_SNAPSHOT, EXCLUSIVE_INTERVALS, LABEL_LIMITS, mapLimits, newSandbox } from "./create-request.ts";
import { targetRegion } from "../organizations/target-region.ts";
import { resolveMounts } from "../volumes/sandbox-mounts.ts";
import { Organization } from "../db/entities.ts";
import { parseNetworkAllowList, refuseDomainAllowList, updateNetwork } from "./network-policy.ts";
import { resizeRequest } from "./resize-request.ts";
import { MAX_FORKS } from "./fork.ts";
import { checkBuildInfo } from "../builds/build-info.ts";
import type { SandboxBuilds } from "../builds/sandbox-builds.ts";
import type { SharedLocks } from "./cluster-locks.ts";
import type { LayerSnapshots } from "./snapshot-sandbox.ts";

// SandboxService (spec 4.5): requests checked with the reference's messages, then handed to the
// manager; every answer is the reference's Sandbox DTO.

const sandboxClasses = enumCodec(SandboxClassSchema);

export interface SandboxServiceDeps {
  orm: MikroORM;
  settings: Settings;
  runtime: SandboxRuntime;
  log?: (line: string) => void;
  pools?: WarmPools;
  /** Registered runners: regions that have some place their sandboxes there. */
  runners?: RunnerDirectory;
  /** Where runners pull snapshot images from. */
  imageSource?: ImageSource;
  /** Where running sandboxes' snapshots are exported to (the internal registry). */
  snapshotPush?: SnapshotPush;
  /** Locks shared by the control processes of the database. */
  sharedLocks?: SharedLocks;
  /** Resolves a create's `snapshot` (an active one of the organization or a general one). */
  /** Builds of sandboxes created with buildInfo. */
  builds?: SandboxBuilds;
  /** The snapshot table, for snapshots of running sandboxes (absent: those answer 503). */
  layerSnapshots?: LayerSnapshots;
  snapshots?: (organizationId: string, idOrName: string, imageUser?: boolean) => Promise<{ name: string; imageRef?: string; user?: string; layers?: { ids: string[]; runnerId: string; image?: string }; row: { cpu: number; mem: number; disk: number } }>;
}

export function sandboxServices(deps: SandboxServiceDeps): { impl: Partial<ServiceImpl<typeof SandboxService>>; manager: SandboxManager } {
  const manager = new SandboxManager({
    orm: deps.orm,
    runtime: deps.runtime,
    dataDir: deps.settings.dataDir,
    minuteMs: deps.settings.timerMinuteMs,
    log: deps.log,
    pools: deps.pools,
    runners: deps.runners,
    imageSource: deps.imageSource,
    snapshotPush: deps.snapshotPush,
    sharedLocks: deps.sharedLocks,
  });
  const { publicUrl } = deps.settings;
  const dtoContext: DtoContext = { toolboxProxyUrl: `${publicUrl}/api/toolbox-proxy` };
  const dto = (r: Parameters<typeof toSandbox>[0]) => toSandbox(r, dtoContext);
  // A sandbox on a runner that stopped answering is `unknown` (not lost: it comes back with its runner).
  const silentRunners = async (): Promise<ReadonlySet<string>> => (deps.runners ? await deps.runners.unresponsive() : new Set());
  const reported = (silent: ReadonlySet<string>) => (r: SandboxRecord) => {
    const d = dto(r);
    if (r.runnerId && silent.has(r.runnerId) && r.state !== "destroyed" && r.state !== "archived") d.state = sandboxStates.number("unknown");
    return d;
  };

  const impl: Partial<ServiceImpl<typeof SandboxService>> = {
    async listSandboxes(req, ctx) {
      const checks = new Checks();
      const base = whereOf(criteria(organizationOf(ctx), req, req.regionIds), checks, sandboxStates.names);
      const paged = req.cursor !== undefined || req.limit !== undefined;
      const limit = checkLimit(checks, req.limit);
      checks.done();
      const sort = CURSOR_SORTS[req.sort] ?? "lastActivityAt";
      const order = req.order === SortOrder.ASC ? "asc" : "desc";
      const filter = cursorPage(base, sort, order, req.cursor, limit);
      if (!paged) filter.limit = undefined; // the bare-array list answers everything
      const rows = await manager.store.list(filter);
      const more = paged && rows.length > limit;
      const items = more ? rows.slice(0, limit) : rows;
      const last = items[items.length - 1];
      return { items: items.map(reported(await silentRunners())), nextCursor: more && last ? encodeCursor(sortValueOf(sort, last), last.id) : undefined };
    },

    async listSandboxesPaginated(req, ctx) {
      const checks = new Checks();
      const base = whereOf(criteria(organizationOf(ctx), req, req.regions), checks, sandboxStates.names);
      const page = req.page ?? 1;
      checks.that(page >= 1, "page must not be less than 1");
      const limit = checkLimit(checks, req.limit);
      checks.done();
      const sort = PAGE_SORTS[req.sort] ?? "createdAt";
      const order = req.order === SortOrder.ASC ? "asc" : "desc";
      const [rows, total] = await Promise.all([manager.store.list(pagePage(base, sort, order, page, limit)), manager.store.count({ ...base, orderBy: "" })]);
      return { items: rows.map(reported(await silentRunners())), total, page, totalPages: Math.ceil(total / limit) };
    },

    async createSandbox(req, ctx) {
      const organizationId = organizationOf(ctx);
      let input = newSandbox(organizationId, req, deps.snapshots !== undefined, deps.settings.sandboxNetwork);
      if (req.buildInfo) {
        const builds = deps.builds;
        if (!builds) throw errors.unavailable("Declarative builds are not available on this server");
        const info = checkBuildInfo(req.buildInfo);
        const volumes = await resolveMounts(deps.orm, organizationId, req.volumes);
        const regionId = await targetRegion(deps.orm, organizationId, req.target);
        return dto(await manager.createFromBuild({ ...input, volumes, regionId }, info, (id, runnerId) => builds.run(organizationId, info, id, runnerId)));
      }
      if (input.snapshot !== DEFAULT_SNAPSHOT && deps.snapshots) {
        // An image snapshot: its resources (a request naming a snapshot names none), its USER unless the request names a user.
        const { name, imageRef, user, layers, row } = await deps.snapshots(organizationId, input.snapshot, req.user === undefined);
        input = { ...input, snapshot: name, imageRef, user: req.user ?? user ?? input.user, cpu: row.cpu, memory: row.mem, disk: row.disk, ...(layers ? { layers: layers.ids, layersRunnerId: layers.runnerId, layersImage: layers.image } : {}) };
      }
      const volumes = await resolveMounts(deps.orm, organizationId, req.volumes);
      return dto(await manager.create({ ...input, volumes, regionId: await targetRegion(deps.orm, organizationId, req.target) }));
    },

    async createSandboxSnapshot(req, ctx) {
      if (!deps.layerSnapshots) throw errors.unavailable("Snapshots are not available on this server");
      return dto(await manager.createSnapshot(deps.layerSnapshots, organizationOf(ctx), req.sandboxId, { name: req.name, includeMemory: req.includeMemory }));
    },

    async forkSandbox(req, ctx) {
      if (req.name) new Checks().displayName("name", req.name).done();
      const [made] = await manager.fork(organizationOf(ctx), req.sandboxId, [req.name || undefined]);
      return dto(made!);
    },

    async forkSandboxes(req, ctx) {
      const count = req.count || req.names.length || 1;
      const checks = new Checks();
      for (const n of req.names) if (n) checks.displayName("names", n);
      checks.that(Number.isInteger(count) && count >= 1 && count <= MAX_FORKS, `count must be between 1 and ${MAX_FORKS}`).that(req.names.length <= count, "names must not be more than count").done();
      const names = Array.from({ length: count }, (_, i) => req.names[i] || undefined);
      return { items: (await manager.fork(organizationOf(ctx), req.sandboxId, names)).map(dto) };
    },

    async getSandboxForks(req, ctx) {
      return { items: (await manager.forks(organizationOf(ctx), req.sandboxId, req.includeDestroyed ?? false)).map(dto) };
    },

    async getSandboxParent(req, ctx) {
      return dto(await manager.parent(organizationOf(ctx), req.sandboxId));
    },

    async getSandboxAncestors(req, ctx) {
      return { items: (await manager.ancestors(organizationOf(ctx), req.sandboxId)).map(dto) };
    },

    async getSandbox(req, ctx) {
      const organizationId = organizationOf(ctx);
      try {
        const row = await manager.get(organizationId, req.sandboxId);
        const silent = await silentRunners();
        const sandbox = reported(silent)(row);
        if (row.state === "started" && !(row.runnerId && silent.has(row.runnerId))) {
          const health = (await manager.runtimeOf(row).then((rt) => rt.inspect(row.id)).catch(() => undefined))?.health;
          if (health) sandbox.health = toHealth(health);
        }
        return sandbox;
      } catch (err) {
        // A sandbox deleted within the last minute (of the timers' clock) still reads as destroyed.
        const gone = err instanceof ConnectError && err.code === Code.NotFound ? await manager.store.recentlyDeleted(organizationId, req.sandboxId, deps.settings.timerMinuteMs) : null;
        if (gone) return dto(gone);
        throw err;
      }
    },

    async deleteSandbox(req, ctx) {
      return dto(await manager.delete(organizationOf(ctx), req.sandboxId));
    },

    async startSandbox(req, ctx) {
      return dto(await manager.start(organizationOf(ctx), req.sandboxId));
    },

    async pauseSandbox(req, ctx) {
      return dto(await manager.pause(organizationOf(ctx), req.sandboxId));
    },

    async stopSandbox(req, ctx) {
      return dto(await manager.stop(organizationOf(ctx), req.sandboxId, req.force ?? false));
    },

    async replaceLabels(req, ctx) {
      mapLimits(new Checks(), "labels", req.labels, LABEL_LIMITS).done();
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { labels: req.labels }));
    },

    async backupSandbox(req, ctx) {
      return dto(await manager.backup(organizationOf(ctx), req.sandboxId));
    },

    async updateNetworkSettings(req, ctx) {
      const organizationId = organizationOf(ctx);
      await manager.get(organizationId, req.sandboxId); // another organization's sandbox: 404 before any 400
      if (req.networkBlockAll === undefined && req.networkAllowList === undefined && req.domainAllowList === undefined) {
        throw errors.invalidArgument("At least one of networkBlockAll, networkAllowList or domainAllowList must be provided");
      }
      const org = await deps.orm.em.fork().findOne(Organization, { id: organizationId });
      if (org?.sandboxLimitedNetworkEgress) throw errors.invalidArgument(LIMITED_EGRESS);
      refuseDomainAllowList(req.domainAllowList);
      if (req.networkAllowList !== undefined) parseNetworkAllowList(req.networkAllowList); // a 400 before the sandbox is looked up
      return dto(await manager.setNetwork(organizationId, req.sandboxId, (cur) => updateNetwork(cur, req.networkBlockAll, req.networkAllowList)));
    },

    async resizeSandbox(req, ctx) {
      return dto(await resize(req, organizationOf(ctx)));
    },

    async resizeWorkspace(req, ctx) {
      return dto(await resize(req, organizationOf(ctx)));
    },

    async setPublicStatus(req, ctx) {
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { public: req.isPublic }));
    },

    async setAutostopInterval(req, ctx) {
      if (req.interval < 0) throw errors.invalidArgument("Auto-stop interval must be non-negative");
      if (req.interval > 0 && (await manager.get(organizationOf(ctx), req.sandboxId)).autoPauseInterval > 0) throw errors.invalidArgument(EXCLUSIVE_INTERVALS);
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { autoStopInterval: req.interval }));
    },

    async setAutoPauseInterval(req, ctx) {
      if (req.interval < 0) throw errors.invalidArgument("Auto-pause interval must be non-negative");
      if (req.interval > 0) {
        const row = await manager.get(organizationOf(ctx), req.sandboxId);
        if (row.autoStopInterval > 0) throw errors.invalidArgument(EXCLUSIVE_INTERVALS);
        if (isEphemeral(row.autoDeleteInterval)) throw errors.invalidArgument("Ephemeral sandboxes cannot have auto-pause enabled. Set autoPauseInterval to 0");
      }
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { autoPauseInterval: req.interval }));
    },

    async setAutoArchiveInterval(req, ctx) {
      if (req.interval < 0) throw errors.invalidArgument("Auto-archive interval must be non-negative");
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { autoArchiveInterval: normalizeAutoArchive(req.interval) }));
    },

    async setAutoDeleteInterval(req, ctx) {
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { autoDeleteInterval: req.interval }));
    },

    async archiveSandbox(req, ctx) {
      return dto(await manager.archive(organizationOf(ctx), req.sandboxId));
    },

    async setTtl(req, ctx) {
      if (req.ttlMinutes < 0) throw errors.invalidArgument("ttlMinutes must be a non-negative integer");
      // In the timers' minutes (tests shrink them); 0 clears the TTL.
      const autoDestroyAt = req.ttlMinutes === 0 ? null : new Date(Date.now() + req.ttlMinutes * deps.settings.timerMinuteMs);
      return dto(await manager.update(organizationOf(ctx), req.sandboxId, { autoDestroyAt }));
    },

    async recoverSandbox(req, ctx) {
      return dto(await manager.recover(organizationOf(ctx), req.sandboxId, req.skipStart ?? false));
    },

    async updateLastActivity(req, ctx) {
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      await manager.store.touch(row.id, new Date());
      manager.activity.stamped(row.id);
      return {};
    },

    // getPortPreviewUrl and the signed preview URLs: preview/service.ts; the signing keys: signing-keys.ts.

    async *getBuildLogs(req, ctx) {
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      if (!row.buildInfo) throw errors.notFound(`Sandbox with ID or name ${req.sandboxId} has no build info`);
      const live = deps.builds?.log(row.id);
      if (!live) {
        // Built by another control process: followed on the sandbox's runner while it builds.
        if (deps.builds && row.runnerId && (row.state === "pending_build" || row.state === "building_snapshot")) yield* deps.builds.fromRunner(row.organizationId, row.buildInfo, row.runnerId, req.follow ?? false, ctx.signal);
        return; // built before this process started: its log is gone
      }
      yield* live.follow(req.follow ?? false, ctx.signal);
    },

    async getBuildLogsUrl(req, ctx) {
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      if (!row.buildInfo) throw errors.notFound(`Sandbox with ID or name ${req.sandboxId} has no build info`);
      return { url: `${publicUrl}/api/sandbox/${row.id}/build-logs` };
    },

    async getToolboxProxyUrl(req, ctx) {
      await manager.get(organizationOf(ctx), req.sandboxId);
      return { url: dtoContext.toolboxProxyUrl };
    },
  };
  async function resize(req: ResizeSandboxRequest, organizationId: string) {
    await manager.get(organizationId, req.sandboxId); // another organization's sandbox: 404 before any 400
    return manager.resize(organizationId, req.sandboxId, resizeRequest(req));
  }

  return { impl, manager };
}

const LIMITED_EGRESS =
  "Network access is restricted and cannot be overridden at the sandbox level. See https://www.daytona.io/docs/en/network-limits/#tier-based-network-restrictions";

const CURSOR_SORTS: Partial<Record<SandboxListSortField, CursorSort>> = {
  [SandboxListSortField.NAME]: "name",
  [SandboxListSortField.CPU]: "cpu",
  [SandboxListSortField.MEMORY_GIB]: "memoryGib",
  [SandboxListSortField.DISK_GIB]: "diskGib",
  [SandboxListSortField.LAST_ACTIVITY_AT]: "lastActivityAt",
  [SandboxListSortField.CREATED_AT]: "createdAt",
};

const PAGE_SORTS: Partial<Record<SandboxSortField, PageSort>> = {
  [SandboxSortField.ID]: "id",
  [SandboxSortField.NAME]: "name",
  [SandboxSortField.STATE]: "state",
  [SandboxSortField.SNAPSHOT]: "snapshot",
  [SandboxSortField.REGION]: "region",
  [SandboxSortField.UPDATED_AT]: "updatedAt",
  [SandboxSortField.CREATED_AT]: "createdAt",
  [SandboxSortField.LAST_ACTIVITY_AT]: "lastActivityAt",
};

interface ListRequestFields {
  id?: string;
  name?: string;
  labels?: string;
  includeErroredDeleted?: boolean;
  states: number[];
  snapshots: string[];
  minCpu?: number;
  maxCpu?: number;
  minMemoryGib?: number;
  maxMemoryGib?: number;
  minDiskGib?: number;
  maxDiskGib?: number;
  isPublic?: boolean;
  isRecoverable?: boolean;
  createdAtAfter?: Parameters<typeof timestampDate>[0];
  createdAtBefore?: Parameters<typeof timestampDate>[0];
  lastEventAfter?: Parameters<typeof timestampDate>[0];
  lastEventBefore?: Parameters<typeof timestampDate>[0];
  sandboxClasses?: number[];
}

function criteria(organizationId: string, req: ListRequestFields, regions: string[]): ListCriteria {
  const date = (t: ListRequestFields["createdAtAfter"]) => (t ? timestampDate(t) : undefined);
  return {
    organizationId,
    idPrefix: req.id,
    namePrefix: req.name,
    labels: req.labels,
    includeErroredDeleted: req.includeErroredDeleted,
    states: req.states.map((s) => sandboxStates.name(s) ?? String(s)),
    snapshots: req.snapshots,
    regions,
    classes: (req.sandboxClasses ?? []).map((c) => sandboxClasses.name(c) ?? String(c)),
    minCpu: req.minCpu,
    maxCpu: req.maxCpu,
    minMemoryGiB: req.minMemoryGib,
    maxMemoryGiB: req.maxMemoryGib,
    minDiskGiB: req.minDiskGib,
    maxDiskGiB: req.maxDiskGib,
    isPublic: req.isPublic,
    isRecoverable: req.isRecoverable,
    createdAtAfter: date(req.createdAtAfter),
    createdAtBefore: date(req.createdAtBefore),
    lastEventAfter: date(req.lastEventAfter),
    lastEventBefore: date(req.lastEventBefore),
  };
}
