import { randomUUID } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { dateOf, type Exec, execIn } from "../db/exec.ts";
import type { BuildInfoRecord } from "../builds/build-info.ts";
import { recordEvent } from "../webhooks/index.ts";
import { isUuid } from "../db/uuid.ts";

// The snapshot table (migration 0011). Every insert, state change and removal writes its webhook
// event in the same transaction as the row change (the row is locked first, so an event names the
// state it really left). General snapshots (no organization) send no events: no organization
// subscribes to them.

export type SnapshotStateName = "pending" | "pulling" | "building" | "active" | "inactive" | "error" | "build_failed" | "removing";

export interface SnapshotRow {
  id: string;
  organizationId: string | null;
  general: boolean;
  name: string;
  imageName: string;
  state: SnapshotStateName;
  errorReason: string | null;
  /** GB. */
  size: number | null;
  entrypoint: string[];
  cpu: number;
  gpu: number;
  mem: number;
  disk: number;
  /** Manifest digest in the host's image store, once pulled. */
  ref: string | null;
  buildLog: string;
  /** A declarative build's Dockerfile, contexts and ref; null for image snapshots. */
  buildInfo: BuildInfoRecord | null;
  /** A running sandbox's snapshot (migration 0025): its captured layers above `ref`'s image, top first; null otherwise. */
  layers: string[] | null;
  /** The runner holding `layers`. */
  runnerId: string | null;
  /** `layers` exported as an OCI image (migration 0028): `<registry>/<repository>@<manifest digest>`, for runners without them. */
  pushedImage: string | null;
  /** Why that export failed (the snapshot stays usable on `runnerId`). */
  pushError: string | null;
  /** The sandbox a running sandbox's snapshot was taken of (migration 0029): its lineage, for changesets since it. */
  sandboxId: string | null;
  createdAt: Date;
  updatedAt: Date;
  lastUsedAt: Date | null;
}

/** The default snapshot's row (migration 0011 inserts it as a general snapshot). */
export const DEFAULT_SNAPSHOT_ID = "00000000-0000-4000-8000-00000000d0d0";

function rowOf(r: Record<string, unknown>): SnapshotRow {
  return {
    id: r.id as string,
    organizationId: (r.organization_id as string | null) ?? null,
    general: r.general as boolean,
    name: r.name as string,
    imageName: r.image_name as string,
    state: r.state as SnapshotStateName,
    errorReason: (r.error_reason as string | null) ?? null,
    size: r.size === null || r.size === undefined ? null : Number(r.size),
    entrypoint: (typeof r.entrypoint === "string" ? JSON.parse(r.entrypoint) : r.entrypoint) as string[],
    cpu: r.cpu as number,
    gpu: r.gpu as number,
    mem: r.mem as number,
    disk: r.disk as number,
    ref: (r.ref as string | null) ?? null,
    buildLog: (r.build_log as string) ?? "",
    buildInfo: r.build_info ? ((typeof r.build_info === "string" ? JSON.parse(r.build_info) : r.build_info) as BuildInfoRecord) : null,
    layers: r.layers ? ((typeof r.layers === "string" ? JSON.parse(r.layers) : r.layers) as string[]) : null,
    runnerId: (r.runner_id as string | null) ?? null,
    pushedImage: (r.pushed_image as string | null) ?? null,
    pushError: (r.push_error as string | null) ?? null,
    sandboxId: (r.sandbox_id as string | null) ?? null,
    createdAt: dateOf(r.created_at as string),
    updatedAt: dateOf(r.updated_at as string),
    lastUsedAt: r.last_used_at ? dateOf(r.last_used_at as string) : null,
  };
}

export interface NewSnapshot {
  organizationId: string;
  name: string;
  imageName: string;
  entrypoint: string[];
  cpu: number;
  gpu: number;
  mem: number;
  disk: number;
  buildInfo?: BuildInfoRecord;
  /** A running sandbox's snapshot: its layers (top first), the runner holding them, its image (null: the default snapshot). */
  layers?: { ids: string[]; runnerId: string; ref: string | null; sandboxId?: string };
}

export type ListSort = "name" | "state" | "last_used_at" | "created_at";

export interface SnapshotPatch {
  state?: SnapshotStateName;
  errorReason?: string | null;
  size?: number | null;
  ref?: string | null;
  entrypoint?: string[];
  buildLog?: string;
  general?: boolean;
  pushedImage?: string | null;
  pushError?: string | null;
}

const COLUMNS: Record<keyof SnapshotPatch, string> = { state: "state", errorReason: "error_reason", size: "size", ref: "ref", entrypoint: "entrypoint", buildLog: "build_log", general: "general", pushedImage: "pushed_image", pushError: "push_error" };

export class SnapshotStore {
  readonly #orm: MikroORM;

  constructor(orm: MikroORM) {
    this.#orm = orm;
  }

  #tx<T>(fn: (exec: Exec) => Promise<T>): Promise<T> {
    return this.#orm.em.fork().transactional((em) => fn(execIn(em)));
  }

  async #query(sql: string, params: unknown[]): Promise<SnapshotRow[]> {
    return ((await execIn(this.#orm.em.fork())(sql, params)) as Record<string, unknown>[]).map(rowOf);
  }

  /** Inserts a `pending` snapshot once the organization's snapshot quota admits it. */
  async insert(s: NewSnapshot): Promise<SnapshotRow> {
    try {
      return await this.#tx(async (exec) => {
        await exec(`select pg_advisory_xact_lock(hashtext('snapshots:' || ?))`, [s.organizationId]);
        const [quota] = (await exec(`select snapshot_quota from organization where id = ?`, [s.organizationId])) as Array<{ snapshot_quota: number | null }>;
        const [{ n }] = (await exec(`select count(*)::int as n from snapshot where organization_id = ? and not general`, [s.organizationId])) as Array<{ n: number }>;
        if (quota?.snapshot_quota !== null && quota?.snapshot_quota !== undefined && n >= quota.snapshot_quota) {
          throw errors.invalidArgument(`Snapshot quota exceeded. Maximum allowed: ${quota.snapshot_quota}`);
        }
        const clash = (await exec(`select 1 from snapshot where general and name = ?`, [s.name])) as unknown[];
        if (clash.length) throw errors.alreadyExists(`Snapshot with name "${s.name}" already exists for this organization`);
        const rows = (await exec(
          `insert into snapshot (id, organization_id, name, image_name, entrypoint, cpu, gpu, mem, disk, build_info, layers, runner_id, ref, sandbox_id)
           values (?, ?, ?, ?, ?::jsonb, ?, ?, ?, ?, ?::jsonb, ?::jsonb, ?, ?, ?) returning *`,
          [randomUUID(), s.organizationId, s.name, s.imageName, JSON.stringify(s.entrypoint), s.cpu, s.gpu, s.mem, s.disk, s.buildInfo ? JSON.stringify(s.buildInfo) : null,
            s.layers ? JSON.stringify(s.layers.ids) : null, s.layers?.runnerId ?? null, s.layers?.ref ?? null, s.layers?.sandboxId ?? null],
        )) as Record<string, unknown>[];
        const row = rowOf(rows[0]!);
        await recordEvent(exec, s.organizationId, "snapshot.created", { id: row.id, name: row.name, organizationId: s.organizationId, state: row.state, createdAt: row.createdAt.toISOString() }, row.createdAt);
        return row;
      });
    } catch (err) {
      if ((err as { code?: string }).code === "23505" || /snapshot_organization_id_name_unique/.test(String(err))) {
        throw errors.alreadyExists(`Snapshot with name "${s.name}" already exists for this organization`);
      }
      throw err;
    }
  }

  async byId(id: string): Promise<SnapshotRow | undefined> {
    if (!isUuid(id)) return undefined;
    return (await this.#query(`select * from snapshot where id = ?`, [id]))[0];
  }

  /** A snapshot the organization sees, by id or name: its own first, then a general one. */
  async find(organizationId: string, idOrName: string): Promise<SnapshotRow> {
    const rows = await this.#query(
      `select * from snapshot where (organization_id = ? or general) and (name = ? or id::text = ?)
        order by (organization_id = ?) desc nulls last, (id::text = ?) desc limit 1`,
      [organizationId, idOrName, isUuid(idOrName) ? idOrName.toLowerCase() : "", organizationId, isUuid(idOrName) ? idOrName.toLowerCase() : ""],
    );
    if (!rows[0]) throw errors.notFound(`Snapshot with ID or name ${idOrName} not found`);
    return rows[0];
  }

  /** The organization's own snapshot (general ones are not theirs to change). */
  async findOwn(organizationId: string, idOrName: string): Promise<SnapshotRow> {
    const row = await this.find(organizationId, idOrName);
    if (row.organizationId !== organizationId) throw errors.permissionDenied("You cannot change a general snapshot");
    return row;
  }

  /** The organization's, then the general ones; sorted (NULLs last), then newest first. */
  async list(organizationId: string, q: { name?: string; sort: ListSort; order: "asc" | "desc"; page: number; limit: number }): Promise<{ items: SnapshotRow[]; total: number }> {
    const where = `(organization_id = ? or general) and state <> 'removing' ${q.name ? `and name ilike ? escape '\\'` : ""}`;
    const params: unknown[] = [organizationId];
    if (q.name) params.push(`%${q.name.replace(/[\\%_]/g, (c) => `\\${c}`)}%`);
    const items = await this.#query(
      `select * from snapshot where ${where}
        order by (organization_id is not distinct from ? and not general) desc, ${q.sort} ${q.order} nulls last, created_at desc, id
        limit ? offset ?`,
      [...params, organizationId, q.limit, (q.page - 1) * q.limit],
    );
    const [{ n }] = (await execIn(this.#orm.em.fork())(`select count(*)::int as n from snapshot where ${where}`, params)) as Array<{ n: number }>;
    return { items, total: n };
  }

  /** Snapshots whose pull or build did not finish (a restart resumes them). */
  unfinished(): Promise<SnapshotRow[]> {
    // A running sandbox's snapshot is made within one operation: pending after a crash is debris (reconcile.ts).
    return this.#query(`select * from snapshot where state in ('pending', 'pulling', 'building') and layers is null order by created_at`, []);
  }

  /**
   * Changes columns of a snapshot; `from` (when given) is the state it must be in, else nothing
   * changes and undefined is answered. A state change records snapshot.state.updated.
   */
  async update(id: string, patch: SnapshotPatch, from?: SnapshotStateName[]): Promise<SnapshotRow | undefined> {
    return this.#tx(async (exec) => {
      const [cur] = ((await exec(`select * from snapshot where id = ? for update`, [id])) as Record<string, unknown>[]).map(rowOf);
      if (!cur || (from && !from.includes(cur.state))) return undefined;
      const entries = Object.entries(patch).filter(([, v]) => v !== undefined) as Array<[keyof SnapshotPatch, unknown]>;
      const sets = entries.map(([k]) => `${COLUMNS[k]} = ?${k === "entrypoint" ? "::jsonb" : ""}`);
      const values = entries.map(([k, v]) => (k === "entrypoint" ? JSON.stringify(v) : v));
      const rows = (await exec(`update snapshot set ${[...sets, "updated_at = clock_timestamp()"].join(", ")} where id = ? returning *`, [...values, id])) as Record<string, unknown>[];
      const row = rowOf(rows[0]!);
      if (patch.state && patch.state !== cur.state && row.organizationId) {
        await recordEvent(exec, row.organizationId, "snapshot.state.updated", { id, name: row.name, organizationId: row.organizationId, oldState: cur.state, newState: row.state, updatedAt: row.updatedAt.toISOString() }, row.updatedAt);
      }
      return row;
    });
  }

  /** A sandbox of the organization (not destroyed) made from the snapshot, if any. */
  async userOf(row: SnapshotRow): Promise<string | undefined> {
    const rows = (await execIn(this.#orm.em.fork())(
      `select name from sandbox where organization_id = ? and snapshot = ? and state <> 'destroyed' limit 1`,
      [row.organizationId, row.name],
    )) as Array<{ name: string }>;
    return rows[0]?.name;
  }

  /** Whether anything still needs the image `ref` on this host (another snapshot or a sandbox). */
  async refInUse(ref: string, except: string): Promise<boolean> {
    const rows = (await execIn(this.#orm.em.fork())(
      `select 1 from snapshot where ref = ? and id <> ? union all select 1 from sandbox where image_ref = ? and state <> 'destroyed' limit 1`,
      [ref, except, ref],
    )) as unknown[];
    return rows.length > 0;
  }

  /** Records the runner a snapshot's build runs on (in its build info): other control processes follow its log there. */
  async buildingOn(id: string, runnerId: string): Promise<void> {
    await execIn(this.#orm.em.fork())(`update snapshot set build_info = build_info || jsonb_build_object('runnerId', ?::text) where id = ? and build_info is not null`, [runnerId, id]);
  }

  async markUsed(id: string): Promise<void> {
    await execIn(this.#orm.em.fork())(`update snapshot set last_used_at = clock_timestamp() where id = ? and (last_used_at is null or last_used_at < clock_timestamp() - interval '1 minute')`, [id]);
  }

  /** Deletes the row, recording snapshot.removed. */
  async remove(id: string): Promise<void> {
    await this.#tx(async (exec) => {
      const rows = ((await exec(`delete from snapshot where id = ? returning *`, [id])) as Record<string, unknown>[]).map(rowOf);
      const row = rows[0];
      if (row?.organizationId) await recordEvent(exec, row.organizationId, "snapshot.removed", { id, name: row.name, organizationId: row.organizationId, removedAt: new Date().toISOString() });
    });
  }
}
