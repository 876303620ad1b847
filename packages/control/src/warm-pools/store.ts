import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { dateOf } from "../db/exec.ts";
import { isUuid } from "../db/uuid.ts";

// The warm_pool table (migration 0027): one row per organization, snapshot and region.

export interface WarmPoolRow {
  id: string;
  organizationId: string;
  snapshot: string;
  imageRef: string | null;
  /** A running sandbox's snapshot: its captured layers, top first. */
  layers: string[] | null;
  regionId: string;
  pool: number;
  cpu: number;
  mem: number;
  disk: number;
  osUser: string;
  env: Record<string, string>;
  /** Members wait paused. */
  paused: boolean;
  createdAt: Date;
  updatedAt: Date;
}

interface RawRow {
  id: string;
  organization_id: string;
  snapshot: string;
  image_ref: string | null;
  layers: string[] | string | null;
  region_id: string;
  pool: number;
  cpu: number;
  mem: number;
  disk: number;
  os_user: string;
  env: Record<string, string> | string;
  paused: boolean;
  created_at: Date | string;
  updated_at: Date | string;
}

function toRow(r: RawRow): WarmPoolRow {
  return {
    id: r.id,
    organizationId: r.organization_id,
    snapshot: r.snapshot,
    imageRef: r.image_ref,
    layers: typeof r.layers === "string" ? JSON.parse(r.layers) : r.layers,
    regionId: r.region_id,
    pool: r.pool,
    cpu: r.cpu,
    mem: r.mem,
    disk: r.disk,
    osUser: r.os_user,
    env: typeof r.env === "string" ? JSON.parse(r.env) : r.env,
    paused: r.paused,
    createdAt: dateOf(r.created_at),
    updatedAt: dateOf(r.updated_at),
  };
}

export class WarmPoolStore {
  readonly #orm: MikroORM;

  constructor(orm: MikroORM) {
    this.#orm = orm;
  }

  async #query(sql: string, params: unknown[]): Promise<WarmPoolRow[]> {
    return ((await this.#orm.em.getConnection().execute(sql, params)) as RawRow[]).map(toRow);
  }

  /** Every organization's pools (made again at start). */
  all(): Promise<WarmPoolRow[]> {
    return this.#query(`select * from warm_pool order by created_at`, []);
  }

  list(organizationId: string): Promise<WarmPoolRow[]> {
    return this.#query(`select * from warm_pool where organization_id = ? order by created_at`, [organizationId]);
  }

  /** The organization's pool; another organization's is not found, like one that does not exist. */
  async find(organizationId: string, id: string): Promise<WarmPoolRow> {
    const [row] = isUuid(id) ? await this.#query(`select * from warm_pool where id = ? and organization_id = ?`, [id, organizationId]) : [];
    if (!row) throw errors.notFound(`Warm pool ${id} not found`);
    return row;
  }

  /** Sandboxes the organization's pools keep, the one named `except` left out. */
  async total(organizationId: string, except?: string): Promise<number> {
    const rows = (await this.#orm.em.getConnection().execute(`select coalesce(sum(pool), 0)::int as n from warm_pool where organization_id = ? and id <> ?`, [organizationId, except ?? "00000000-0000-0000-0000-000000000000"])) as Array<{ n: number }>;
    return rows[0]?.n ?? 0;
  }

  async insert(row: WarmPoolRow): Promise<WarmPoolRow> {
    try {
      const [made] = await this.#query(
        `insert into warm_pool (id, organization_id, snapshot, image_ref, layers, region_id, pool, cpu, mem, disk, os_user, env, paused, created_at, updated_at)
          values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) returning *`,
        [row.id, row.organizationId, row.snapshot, row.imageRef, row.layers ? JSON.stringify(row.layers) : null, row.regionId, row.pool, row.cpu, row.mem, row.disk, row.osUser, JSON.stringify(row.env), row.paused, row.createdAt, row.updatedAt],
      );
      return made!;
    } catch (err) {
      if ((err as { code?: string }).code === "23505") throw errors.alreadyExists(`Warm pool for snapshot ${row.snapshot} in region ${row.regionId} already exists`);
      throw err;
    }
  }

  async resize(organizationId: string, id: string, pool: number): Promise<WarmPoolRow> {
    const [row] = await this.#query(`update warm_pool set pool = ?, updated_at = now() where id = ? and organization_id = ? returning *`, [pool, id, organizationId]);
    if (!row) throw errors.notFound(`Warm pool ${id} not found`);
    return row;
  }

  async remove(organizationId: string, id: string): Promise<void> {
    await this.#orm.em.getConnection().execute(`delete from warm_pool where id = ? and organization_id = ?`, [id, organizationId]);
  }
}
