import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { type WarmPool, WarmPoolSchema, type WarmPoolService } from "@sandbar/protocol/gen/sandbar/control/v1/warm_pool_pb.js";
import { organizationOf } from "../call/call.ts";
import { targetRegion } from "../organizations/target-region.ts";
import { DEFAULT_SNAPSHOT, DEFAULT_USER, RESOURCES } from "../sandboxes/create-request.ts";
import type { PoolShape } from "../sandboxes/warm-pool.ts";
import type { WarmPools } from "../sandboxes/warm-pools.ts";
import { Checks } from "../services/validate.ts";
import { type WarmPoolRow, WarmPoolStore } from "./store.ts";

// WarmPoolService: the organization's pools as rows, each kept filled by a WarmPool of this
// server's runtime (sandboxes/warm-pools.ts). A pool's shape is what a create of its snapshot
// gets (the snapshot's resources and user), so such creates claim its sandboxes.

export interface WarmPoolDeps {
  orm: MikroORM;
  /** Undefined where this server runs no sandboxes itself: pools are refused with the reason. */
  pools: WarmPools | undefined;
  /** The snapshot a create names: its name, image and resources (snapshots/service.ts). */
  snapshots?: (organizationId: string, idOrName: string, imageUser?: boolean) => Promise<{ name: string; imageRef?: string; user?: string; layers?: { ids: string[]; runnerId: string }; row: { cpu: number; mem: number; disk: number } }>;
  /** This server's runtime: a running sandbox's snapshot is pooled only where its layers are. */
  runnerId: string;
  /** Whether a region's sandboxes are placed on registered runners (pools live on this server only). */
  placedElsewhere: (regionId: string) => Promise<boolean>;
  /** Most pool sandboxes an organization may keep, over all its pools. */
  maxPerOrganization: number;
}

/** The shape of the pool's sandboxes, kept in its row. */
function shapeOf(row: WarmPoolRow): PoolShape {
  return { snapshot: row.snapshot, ...(row.imageRef ? { imageRef: row.imageRef } : {}), ...(row.layers?.length ? { layers: row.layers } : {}), cpu: row.cpu, memory: row.mem, disk: row.disk, user: row.osUser };
}

/** Makes every organization's pool again (at start; they fill once reconciliation is done). */
export async function loadWarmPools(orm: MikroORM, pools: WarmPools): Promise<void> {
  for (const row of await new WarmPoolStore(orm).all()) await pools.set(row.id, row.organizationId, row.regionId, row.pool, shapeOf(row), row.paused);
}

export function warmPoolService(deps: WarmPoolDeps): Partial<ServiceImpl<typeof WarmPoolService>> {
  const store = new WarmPoolStore(deps.orm);
  const pools = () => {
    if (!deps.pools) throw errors.failedPrecondition("Warm pools are not available on this server: it runs no sandboxes itself");
    return deps.pools;
  };
  const toDto = (r: WarmPoolRow): WarmPool => {
    const live = deps.pools?.get(r.id);
    return create(WarmPoolSchema, {
      id: r.id,
      organizationId: r.organizationId,
      snapshot: r.snapshot,
      target: r.regionId,
      pool: r.pool,
      currentSize: live?.stats().ready ?? 0,
      cpu: r.cpu,
      mem: r.mem,
      disk: r.disk,
      osUser: r.osUser,
      env: r.env,
      paused: r.paused,
      errorReason: live?.lastError,
      createdAt: timestampFromDate(r.createdAt),
      updatedAt: timestampFromDate(r.updatedAt),
    });
  };
  const checkSize = (checks: Checks, pool: number) =>
    checks.that(Number.isInteger(pool) && pool >= 0 && pool <= deps.maxPerOrganization, `pool must be an integer from 0 to ${deps.maxPerOrganization}`);
  const withinTotal = async (organizationId: string, pool: number, except?: string) => {
    const others = await store.total(organizationId, except);
    if (others + pool > deps.maxPerOrganization) {
      throw errors.invalidArgument(`Warm pools of an organization keep at most ${deps.maxPerOrganization} sandboxes in all; its other pools keep ${others}`);
    }
  };

  return {
    async listWarmPools(_req, ctx) {
      return { items: (await store.list(organizationOf(ctx))).map(toDto) };
    },

    async getWarmPool(req, ctx) {
      return toDto(await store.find(organizationOf(ctx), req.id));
    },

    async createWarmPool(req, ctx) {
      const organizationId = organizationOf(ctx);
      const checks = new Checks().that(req.snapshot.trim().length > 0, "snapshot should not be empty");
      checkSize(checks, req.pool).done();
      const live = pools();
      const regionId = await targetRegion(deps.orm, organizationId, req.target);
      if (await deps.placedElsewhere(regionId)) throw errors.invalidArgument(`Warm pools are kept on this server's own runtime; region ${regionId} places its sandboxes on registered runners`);
      let shape: PoolShape;
      const name = req.snapshot.trim();
      if (name === DEFAULT_SNAPSHOT || !deps.snapshots) {
        if (name !== DEFAULT_SNAPSHOT) throw errors.invalidArgument(`Snapshot ${name} not found. Only the default snapshot (${DEFAULT_SNAPSHOT}) exists on this server`);
        shape = { snapshot: DEFAULT_SNAPSHOT, cpu: RESOURCES.cpu.default, memory: RESOURCES.memory.default, disk: RESOURCES.disk.default, user: DEFAULT_USER };
      } else {
        const s = await deps.snapshots(organizationId, name, true);
        if (s.layers && s.layers.runnerId !== deps.runnerId) throw errors.invalidArgument(`Snapshot ${name} was taken of a sandbox on runner ${s.layers.runnerId}: warm pools are kept on this server's own runtime`);
        shape = { snapshot: s.name, ...(s.imageRef ? { imageRef: s.imageRef } : {}), ...(s.layers ? { layers: s.layers.ids } : {}), cpu: s.row.cpu, memory: s.row.mem, disk: s.row.disk, user: s.user ?? DEFAULT_USER };
      }
      await withinTotal(organizationId, req.pool);
      const now = new Date();
      const row = await store.insert({
        id: randomUUID(),
        organizationId,
        snapshot: shape.snapshot,
        imageRef: shape.imageRef ?? null,
        layers: shape.layers ?? null,
        regionId,
        pool: req.pool,
        cpu: shape.cpu,
        mem: shape.memory,
        disk: shape.disk,
        osUser: shape.user,
        env: {},
        paused: req.paused ?? false,
        createdAt: now,
        updatedAt: now,
      });
      (await live.set(row.id, organizationId, regionId, row.pool, shape, row.paused)).fill();
      return toDto(row);
    },

    async updateWarmPool(req, ctx) {
      const organizationId = organizationOf(ctx);
      checkSize(new Checks(), req.pool).done();
      const live = pools();
      const before = await store.find(organizationId, req.id);
      await withinTotal(organizationId, req.pool, before.id);
      const row = await store.resize(organizationId, before.id, req.pool);
      await live.set(row.id, organizationId, row.regionId, row.pool, shapeOf(row), row.paused);
      return toDto(row);
    },

    async deleteWarmPool(req, ctx) {
      const organizationId = organizationOf(ctx);
      const row = await store.find(organizationId, req.id);
      await store.remove(organizationId, row.id);
      await deps.pools?.remove(row.id);
      return {};
    },
  };
}
