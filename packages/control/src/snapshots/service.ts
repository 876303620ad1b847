import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import { SandboxClass, SortOrder } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { type CreateSnapshotRequest, type SnapshotService, SnapshotSortField } from "@sandbar/protocol/gen/sandbar/control/v1/snapshot_pb.js";
import { type ImageStore, imageUser, parseImageRef } from "@sandbar/runner/images";
import { callerOf, organizationOf } from "../call/call.ts";
import { checkBuildInfo } from "../builds/build-info.ts";
import { Builder, type PushTarget } from "../builds/builder.ts";
import type { BuildTargets } from "../builds/build-targets.ts";
import type { BuildContexts } from "../object-storage/index.ts";
import { targetRegion } from "../organizations/target-region.ts";
import { DEFAULT_SNAPSHOT, RESOURCES } from "../sandboxes/create-request.ts";
import { Checks } from "../services/validate.ts";
import { toSnapshot } from "./dto.ts";
import { checkSnapshotName } from "./names.ts";
import type { CredentialsFor } from "./credentials-for.ts";
import { type PullSettings, SnapshotPulls } from "./pulls.ts";
import { DEFAULT_SNAPSHOT_ID, type ListSort, type SnapshotRow, type SnapshotStateName, SnapshotStore } from "./store.ts";

// SnapshotService (spec 4.7, the /images aliases of 4.11): snapshots from OCI images, pulled in the
// background on this host (pulls.ts), per organization, with the default snapshot listed as a
// general one. Reads take an id or a name; changes only the organization's own snapshots.

export interface SnapshotDeps {
  orm: MikroORM;
  /** This host's image store; absent when sandboxes cannot run here. */
  images?: () => Promise<ImageStore>;
  settings: PullSettings;
  /** The hook the registries API fills: credentials per organization and registry host. */
  credentialsFor?: CredentialsFor;
  /** How clients reach this server (build-logs-url answers). */
  publicUrl?: string;
  /** Build contexts in object storage: declarative builds need them. */
  contexts?: BuildContexts;
  /** Where declarative builds run (builds/build-targets.ts); without it, no builds. */
  buildTargets?: BuildTargets;
  /** The internal registry's repository and push account for a build (so that every runner can pull it). */
  buildPush?: PushTarget;
  /** A build's log on the runner running it (GetSnapshotLogs), for builds another control process dispatched. */
  runnerLogs?: (runnerId: string, ref: string, follow: boolean, signal: AbortSignal) => AsyncIterable<{ data: Uint8Array }>;
  /** Records that a runner holds an image it built. */
  held?: (runnerId: string, digest: string) => Promise<void>;
  /** Removes an image from the registered runners that hold it (runners/directory.ts). */
  dropFromRunners?: (digest: string) => Promise<void>;
  log?: (line: string) => void;
}

const DEACTIVATABLE: SnapshotStateName[] = ["pending", "pulling", "building", "active", "error", "build_failed"];
const SORTS: Partial<Record<SnapshotSortField, ListSort>> = {
  [SnapshotSortField.NAME]: "name",
  [SnapshotSortField.STATE]: "state",
  [SnapshotSortField.LAST_USED_AT]: "last_used_at",
  [SnapshotSortField.CREATED_AT]: "created_at",
};

export interface Snapshots {
  impl: Partial<ServiceImpl<typeof SnapshotService>>;
  store: SnapshotStore;
  pulls: SnapshotPulls;
  /** Declarative builds on this host (absent without object storage). */
  builder?: Builder;
  /** The active snapshot a sandbox create names (its image digest, or none for the default snapshot). */
  /** `imageUser`: whether to read the image's USER (as a user name, into `user`): a request naming its user does not. */
  forSandbox(organizationId: string, idOrName: string, imageUser?: boolean): Promise<{ name: string; imageRef?: string; user?: string; layers?: { ids: string[]; runnerId: string; image?: string }; row: SnapshotRow }>;
}

export function snapshotServices(deps: SnapshotDeps): Snapshots {
  const store = new SnapshotStore(deps.orm);
  const unavailable = async (): Promise<never> => {
    throw errors.unavailable("Snapshots from images are not available on this server: sandboxes cannot run here");
  };
  const images = deps.images ?? unavailable;
  const maxSizeGb = async (organizationId: string) => {
    const rows = (await deps.orm.em.getConnection().execute(`select max_snapshot_size from organization where id = ?`, [organizationId])) as Array<{ max_snapshot_size: number | null }>;
    return rows[0]?.max_snapshot_size ?? null;
  };
  const credentialsFor = deps.credentialsFor ?? (async () => undefined);
  const builder = deps.contexts && deps.buildTargets ? new Builder({ targets: deps.buildTargets, contexts: deps.contexts, credentialsFor, mirror: deps.settings.mirror, push: deps.buildPush, held: deps.held }) : undefined;
  const pulls = new SnapshotPulls({ store, images, credentialsFor, settings: deps.settings, maxSizeGb, log: deps.log ?? (() => undefined), builder });
  const isAdmin = (ctx: HandlerContext) => callerOf(ctx).systemRole === "admin";

  async function setActive(ctx: HandlerContext, id: string, active: boolean): Promise<SnapshotRow> {
    const row = await store.findOwn(organizationOf(ctx), id);
    if (active) {
      if (row.state === "active") throw errors.invalidArgument(`Snapshot ${row.id} is already active`);
      if (row.state !== "inactive") throw errors.invalidArgument(`Snapshot ${row.id} cannot be activated - it is in ${row.state} state`);
      // Deactivation keeps the image on this host; without it the snapshot is pulled again.
      // A build's image is on the runners that hold it: activation builds again (the runner's cache answers).
      const present = row.ref && !row.buildInfo ? await (await images()).get(row.ref) : undefined;
      const next = await store.update(row.id, { state: present ? "active" : "pending" }, ["inactive"]);
      if (!next) throw errors.invalidArgument(`Snapshot ${row.id} cannot be activated - it changed meanwhile`);
      if (next.state === "pending") pulls.start(next);
      return next;
    }
    if (row.state === "inactive") return row;
    // As the reference: inactive from any state. A pull or build under way is stopped (its end
    // only moves a snapshot that is still pulling or building); activation pulls or builds again.
    const next = await store.update(row.id, { state: "inactive" }, DEACTIVATABLE);
    if (!next) throw errors.invalidArgument(`Snapshot ${row.id} cannot be deactivated - it is being removed`);
    await pulls.cancel(row.id);
    return next;
  }

  const impl: Partial<ServiceImpl<typeof SnapshotService>> = {
    async createSnapshot(req, ctx) {
      const organizationId = organizationOf(ctx);
      const input = checkCreate(req);
      if (req.general && !isAdmin(ctx)) throw errors.permissionDenied("Insufficient permissions for creating general images");
      const regionId = req.regionId ? await targetRegion(deps.orm, organizationId, req.regionId) : undefined;
      // A build runs in the region asked for (its runners, or this server's runtime); a pull on this host.
      if (!input.buildInfo) await images(); // 503 here rather than a snapshot in error
      if (input.buildInfo && !builder) throw errors.unavailable("Declarative builds are not available on this server");
      let row = await store.insert({ organizationId, ...input, ...(input.buildInfo && regionId ? { buildInfo: { ...input.buildInfo, regionId } } : {}) });
      if (req.general) row = (await store.update(row.id, { general: true })) ?? row;
      pulls.start(row);
      return toSnapshot(row);
    },

    async listSnapshots(req, ctx) {
      const page = req.page ?? 1;
      const limit = req.limit ?? 100;
      new Checks().that(Number.isInteger(page) && page >= 1, "page must not be less than 1").that(limit >= 1, "limit must not be less than 1").that(limit <= 200, "limit must not be greater than 200").done();
      const { items, total } = await store.list(organizationOf(ctx), {
        name: req.name || undefined,
        sort: SORTS[req.sort] ?? "last_used_at",
        order: req.order === SortOrder.ASC ? "asc" : "desc",
        page,
        limit,
      });
      return { items: items.map(toSnapshot), total, page, totalPages: Math.ceil(total / limit) };
    },

    async getSnapshot(req, ctx) {
      return toSnapshot(await store.find(organizationOf(ctx), req.id));
    },

    async deleteSnapshot(req, ctx) {
      const organizationId = organizationOf(ctx);
      const row = await store.find(organizationId, req.id);
      if (row.general || row.organizationId !== organizationId) throw errors.permissionDenied("You cannot delete a general snapshot");
      const user = await store.userOf(row);
      if (user !== undefined) throw errors.failedPrecondition(`Snapshot cannot be deleted because it is in use by one or more sandboxes (e.g. ${user})`);
      await store.update(row.id, { state: "removing" });
      await pulls.cancel(row.id);
      // The image goes from this host when nothing else needs it (another snapshot of the same image, a sandbox).
      if (row.ref && !(await store.refInUse(row.ref, row.id))) {
        try {
          await (await images()).remove(row.ref);
        } catch (err) {
          // The row goes regardless: a leftover image costs disk, not correctness.
          deps.log?.(`snapshot ${row.id}: removing image ${row.ref} failed: ${err instanceof Error ? err.message : String(err)}`);
        }
        await deps.dropFromRunners?.(row.ref);
      }
      await store.remove(row.id);
      return {};
    },

    async toggleSnapshot(req, ctx) {
      const row = await store.findOwn(organizationOf(ctx), req.id);
      const enable = req.enabled ?? row.state === "inactive";
      if (enable === (row.state !== "inactive")) return toSnapshot(row);
      return toSnapshot(await setActive(ctx, req.id, enable));
    },

    async activateSnapshot(req, ctx) {
      return toSnapshot(await setActive(ctx, req.id, true));
    },

    async deactivateSnapshot(req, ctx) {
      await setActive(ctx, req.id, false);
      return {};
    },

    // Operator only (the route's auth): any organization's snapshot, by id.
    async setSnapshotGeneral(req) {
      const row = await store.byId(req.id);
      if (!row) throw errors.notFound(`Snapshot with ID or name ${req.id} not found`);
      if (row.id === DEFAULT_SNAPSHOT_ID && !req.general) throw errors.invalidArgument("The default snapshot stays general");
      return toSnapshot((await store.update(row.id, { general: req.general })) ?? row);
    },

    async getSnapshotBuildLogsUrl(req, ctx) {
      const row = await store.find(organizationOf(ctx), req.id);
      return { url: `${deps.publicUrl ?? ""}/api/snapshots/${row.id}/build-logs` };
    },

    async *getSnapshotBuildLogs(req, ctx) {
      const row = await store.find(organizationOf(ctx), req.id);
      const live = pulls.live(row.id);
      const info = row.buildInfo;
      if (!live && row.state === "building" && info?.runnerId && row.organizationId && deps.runnerLogs) {
        // Another control process runs this build: the runner building it has its log.
        let sent = false;
        try {
          for await (const chunk of deps.runnerLogs(info.runnerId, Builder.key(row.organizationId, info), req.follow ?? false, ctx.signal)) {
            sent = true;
            yield { data: chunk.data };
          }
          return;
        } catch (err) {
          // The runner has no such build (restarted meanwhile): what is recorded, below.
          if (sent || !(err instanceof ConnectError && err.code === Code.NotFound)) throw err;
        }
      }
      if (!live) {
        // Ended (or never pulled: the default snapshot): what was recorded.
        if (row.buildLog) yield { data: new TextEncoder().encode(row.buildLog) };
        return;
      }
      yield* live.follow(req.follow ?? false, ctx.signal);
    },
  };

  return {
    impl,
    store,
    pulls,
    builder,
    async forSandbox(organizationId, idOrName, wantUser = false) {
      const row = await store.find(organizationId, idOrName).catch((err: unknown) => {
        if (err instanceof ConnectError && err.code === Code.NotFound) throw errors.invalidArgument(`Snapshot ${idOrName} not found. Did you add it through the Daytona Dashboard?`);
        throw err;
      });
      if (row.state !== "active") throw errors.invalidArgument(`Snapshot ${idOrName} is ${row.state}`);
      if (row.id === DEFAULT_SNAPSHOT_ID) return { name: DEFAULT_SNAPSHOT, row };
      if (row.layers && row.runnerId) {
        // A running sandbox's snapshot: its image (none: the default snapshot) and its layers, on the runner holding them;
        // and the image they were exported as, once pushed, for creates that cannot use them (create.ts).
        await store.markUsed(row.id).catch(() => undefined);
        const image = wantUser && row.ref ? await (await images()).get(row.ref) : undefined;
        const pushed = row.pushedImage?.split("@")[1];
        return { name: row.name, imageRef: row.ref ?? undefined, user: image ? await imageUser(image) : undefined, layers: { ids: row.layers, runnerId: row.runnerId, ...(pushed ? { image: pushed } : {}) }, row };
      }
      if (!row.ref) throw errors.invalidArgument("Snapshot ref is not defined");
      await store.markUsed(row.id).catch(() => undefined);
      const image = wantUser ? await (await images()).get(row.ref) : undefined;
      const user = image ? await imageUser(image) : undefined;
      return { name: row.name, imageRef: row.ref, user, row };
    },
  };
}

/** The reference's checks of a create body, field problems together, then its rules in order. */
function checkCreate(req: CreateSnapshotRequest) {
  const checks = checkSnapshotName(new Checks(), req.name);
  for (const field of ["cpu", "memory", "disk", "gpu"] as const) {
    const v = req[field];
    checks.that(v === undefined || v >= 0, `${field} must not be less than 0`);
  }
  checks.that(req.gpu === undefined || req.gpu <= 1, "gpu must not be greater than 1");
  checks.done();
  if (req.buildInfo && req.imageName) throw errors.invalidArgument("Cannot specify an image name when using a build info entry");
  if (req.buildInfo && req.entrypoint.length) throw errors.invalidArgument("Cannot specify an entrypoint when using a build info entry");
  if (req.sandboxClass === SandboxClass.WINDOWS) throw errors.invalidArgument("Windows snapshots cannot be created via this endpoint; they are produced by snapshot-from-sandbox flows.");
  if (req.buildInfo) {
    const buildInfo = checkBuildInfo(req.buildInfo);
    if (req.gpu) throw errors.invalidArgument(`GPU request ${req.gpu} exceeds maximum allowed per sandbox (0).`);
    return { name: req.name, imageName: buildInfo.snapshotRef, entrypoint: [], cpu: req.cpu || RESOURCES.cpu.default, gpu: 0, mem: req.memory || RESOURCES.memory.default, disk: req.disk || RESOURCES.disk.default, buildInfo };
  }
  // The earlier CreateImage (POST /images): `name` is the image reference itself.
  const imageName = req.imageName ?? (req.name.includes(":") || req.name.includes("@") ? req.name : undefined);
  if (!imageName) throw errors.invalidArgument("Must specify an image name when not using a build info entry");
  parseImageRef(imageName); // the reference's 400s for names, tags, digests and `:latest`
  if (req.gpu) throw errors.invalidArgument(`GPU request ${req.gpu} exceeds maximum allowed per sandbox (0).`);
  return {
    name: req.name,
    imageName: imageName.trim(),
    entrypoint: req.entrypoint.filter((e) => e !== ""),
    cpu: req.cpu || RESOURCES.cpu.default,
    gpu: 0,
    mem: req.memory || RESOURCES.memory.default,
    disk: req.disk || RESOURCES.disk.default,
  };
}
