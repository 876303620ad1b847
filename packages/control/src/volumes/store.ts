import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { dateOf, type Exec, execIn } from "../db/exec.ts";
import { recordEvent } from "../webhooks/index.ts";
import { isUuid } from "../db/uuid.ts";

// The volume table. Every insert and change of state writes its webhook event in the same
// transaction (the row is locked first, so the event names the state it really left).

export type VolumeState = "creating" | "ready" | "pending_create" | "pending_delete" | "deleting" | "deleted" | "error";

export interface VolumeRow {
  id: string;
  organizationId: string;
  name: string;
  state: VolumeState;
  errorReason: string | null;
  createdAt: Date;
  updatedAt: Date;
  lastUsedAt: Date | null;
}

interface RawRow {
  id: string;
  organization_id: string;
  name: string;
  state: VolumeState;
  error_reason: string | null;
  created_at: Date | string;
  updated_at: Date | string;
  last_used_at: Date | string | null;
}

function toRow(r: RawRow): VolumeRow {
  return {
    id: r.id,
    organizationId: r.organization_id,
    name: r.name,
    state: r.state,
    errorReason: r.error_reason,
    createdAt: dateOf(r.created_at),
    updatedAt: dateOf(r.updated_at),
    lastUsedAt: r.last_used_at === null ? null : dateOf(r.last_used_at),
  };
}

async function rows(exec: Exec, sql: string, params: unknown[]): Promise<VolumeRow[]> {
  return ((await exec(sql, params)) as RawRow[]).map(toRow);
}

/** The mounts column value that matches sandboxes mounting `id` (jsonb containment). */
const mounting = (id: string) => JSON.stringify([{ volumeId: id }]);

export class VolumeStore {
  readonly #orm: MikroORM;

  constructor(orm: MikroORM) {
    this.#orm = orm;
  }

  #exec(): Exec {
    return execIn(this.#orm.em.fork());
  }

  /** Inserts a `pending_create` volume once the quota and the name allow it. */
  async insert(id: string, organizationId: string, name: string): Promise<VolumeRow> {
    const now = new Date();
    try {
      return await this.#orm.em.fork().transactional(async (em) => {
        const exec = execIn(em);
        // The organization's row serializes creates, so two at once cannot both pass the quota.
        const [org] = (await exec(`select volume_quota from organization where id = ? for update`, [organizationId])) as Array<{ volume_quota: number }>;
        if (!org) throw errors.notFound("Organization not found");
        const [{ n }] = (await exec(`select count(*)::int as n from volume where organization_id = ? and state <> 'deleted'`, [organizationId])) as Array<{ n: number }>;
        if (n >= org.volume_quota) throw errors.invalidArgument(`Volume quota exceeded. Maximum allowed: ${org.volume_quota}`);
        const taken = (await exec(`select 1 from volume where organization_id = ? and name = ? and state <> 'deleted'`, [organizationId, name])) as unknown[];
        if (taken.length) throw errors.invalidArgument(`Volume with name ${name} already exists`);
        const [row] = await rows(
          exec,
          `insert into volume (id, organization_id, name, state, created_at, updated_at) values (?, ?, ?, 'pending_create', ?, ?) returning *`,
          [id, organizationId, name, now, now],
        );
        await recordEvent(exec, organizationId, "volume.created", { id, name, organizationId, state: row!.state, createdAt: now.toISOString() }, now);
        return row!;
      });
    } catch (err) {
      if ((err as { code?: string }).code === "23505") throw errors.invalidArgument(`Volume with name ${name} already exists`);
      throw err;
    }
  }

  /**
   * Moves the volume to `to` when it is in one of `from` (any state when omitted); answers the row
   * after the change, or undefined when it was not in `from`.
   */
  async transition(id: string, to: VolumeState, opts: { from?: VolumeState[]; errorReason?: string | null; rename?: string } = {}): Promise<VolumeRow | undefined> {
    return this.#orm.em.fork().transactional(async (em) => {
      const exec = execIn(em);
      const [before] = await rows(exec, `select * from volume where id = ? for update`, [id]);
      if (!before || (opts.from && !opts.from.includes(before.state))) return undefined;
      return this.#apply(exec, before, to, opts);
    });
  }

  async #apply(exec: Exec, before: VolumeRow, to: VolumeState, opts: { errorReason?: string | null; rename?: string }): Promise<VolumeRow> {
    const now = new Date();
    if (opts.rename !== undefined) {
      // Only one `<name>-deleted` per organization: an older one is purged (as the reference does).
      await exec(`delete from volume where organization_id = ? and name = ? and state = 'deleted' and id <> ?`, [before.organizationId, opts.rename, before.id]);
    }
    const [after] = await rows(exec, `update volume set state = ?, error_reason = ?, name = ?, updated_at = ? where id = ? returning *`, [
      to,
      opts.errorReason === undefined ? before.errorReason : opts.errorReason,
      opts.rename ?? before.name,
      now,
      before.id,
    ]);
    await recordEvent(exec, before.organizationId, "volume.state.updated", { id: before.id, name: after!.name, organizationId: before.organizationId, oldState: before.state, newState: to, updatedAt: now.toISOString() }, now);
    return after!;
  }

  /**
   * Marks the volume for deletion, unless it is not ready (or in error) or a sandbox that is not
   * being destroyed mounts it. The volume row is locked first: a sandbox insert that mounts it
   * (lockForMount) waits, then sees the new state.
   */
  async markForDeletion(organizationId: string, id: string): Promise<VolumeRow> {
    return this.#orm.em.fork().transactional(async (em) => {
      const exec = execIn(em);
      const [before] = isUuid(id) ? await rows(exec, `select * from volume where id = ? and organization_id = ? and state <> 'deleted' for update`, [id, organizationId]) : [];
      if (!before) throw errors.notFound(`Volume with ID ${id} not found`);
      if (before.state !== "ready" && before.state !== "error") throw errors.invalidArgument("Volume must be in 'ready' or 'error' state in order to be deleted");
      const users = (await exec(`select name from sandbox where desired_state <> 'destroyed' and state <> 'destroyed' and volumes @> ?::jsonb limit 1`, [mounting(id)])) as Array<{ name: string }>;
      if (users.length) throw errors.failedPrecondition(`Volume cannot be deleted because it is in use by one or more sandboxes (e.g. ${users[0]!.name})`);
      return this.#apply(exec, before, "pending_delete", {});
    });
  }

  /** The organization's volume by id (deleted ones too); 404 otherwise. */
  async get(organizationId: string, id: string): Promise<VolumeRow> {
    const [row] = isUuid(id) ? await rows(this.#exec(), `select * from volume where id = ? and organization_id = ?`, [id, organizationId]) : [];
    if (!row) throw errors.notFound(`Volume with ID ${id} not found`);
    return row;
  }

  async byName(organizationId: string, name: string): Promise<VolumeRow> {
    const [row] = await rows(this.#exec(), `select * from volume where organization_id = ? and name = ? and state <> 'deleted'`, [organizationId, name]);
    if (!row) throw errors.notFound(`Volume with name ${name} not found`);
    return row;
  }

  async list(organizationId: string, includeDeleted: boolean): Promise<VolumeRow[]> {
    return rows(
      this.#exec(),
      `select * from volume where organization_id = ? ${includeDeleted ? "" : "and state <> 'deleted'"} order by last_used_at desc nulls last, created_at desc, id`,
      [organizationId],
    );
  }

  /** Non-deleted volumes of the organization that a sandbox's reference (id or name) may mean. */
  async candidates(organizationId: string, ref: string): Promise<VolumeRow[]> {
    return rows(
      this.#exec(),
      `select * from volume where organization_id = ? and state <> 'deleted' and (name = ?${isUuid(ref) ? " or id = ?" : ""})`,
      isUuid(ref) ? [organizationId, ref, ref] : [organizationId, ref],
    );
  }

  /** Volumes a create or delete left between its steps. */
  async unfinished(): Promise<VolumeRow[]> {
    return rows(this.#exec(), `select * from volume where state in ('pending_create', 'creating', 'pending_delete', 'deleting') order by created_at`, []);
  }

  /** Stamps use (at most once a minute, as the reference does). */
  async touch(ids: string[], at: Date): Promise<void> {
    if (!ids.length) return;
    await this.#exec()(`update volume set last_used_at = ? where id = any(?::uuid[]) and (last_used_at is null or last_used_at < ?)`, [at, `{${ids.join(",")}}`, new Date(at.getTime() - 60_000)]);
  }
}

/**
 * Inside a sandbox insert's transaction: holds the mounted volumes (share locks, so a delete waits)
 * and refuses any that stopped being ready since the request was checked.
 */
export async function lockForMount(exec: Exec, ids: string[]): Promise<void> {
  if (!ids.length) return;
  const found = await rows(exec, `select * from volume where id = any(?::uuid[]) for share`, [`{${ids.join(",")}}`]);
  for (const id of ids) {
    const v = found.find((r) => r.id === id);
    if (!v) throw errors.notFound(`Volume '${id}' not found`);
    if (v.state !== "ready") throw errors.invalidArgument(`Volume '${v.name}' is not in a ready state. Current state: ${v.state}`);
  }
}
