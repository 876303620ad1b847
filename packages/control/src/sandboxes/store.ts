import type { EntityDictionary, EntityManager, MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { SandboxRecord } from "../db/entities.ts";
import { type Exec, execIn } from "../db/exec.ts";
import { admit, type Demand } from "../organizations/usage.ts";
import { recordSandboxCreated, recordSandboxStateChange } from "../webhooks/sandbox-events.ts";
import type { ListFilter } from "./list-query.ts";
import { lockForMount } from "../volumes/store.ts";
import { isUuid } from "../db/uuid.ts";

// The sandbox table. Updates name the columns they change (never a whole-row write), so a
// lifecycle operation and a labels or interval change made meanwhile never undo each other.
// Times are written from JS Dates (millisecond precision), which keeps list cursors exact.
// Every insert and every change of state or desiredState writes its webhook event in the same
// transaction (the row is locked first, so the event names the state it really left).

export type SandboxPatch = Partial<Omit<SandboxRecord, "id" | "organizationId" | "createdAt">>;

/** Rows the API shows: not destroyed, and not an errored sandbox on its way out. */
const VISIBLE = { state: { $ne: "destroyed" }, $not: { state: { $in: ["error", "build_failed"] }, desiredState: "destroyed" } } as const;

/** Rows a write changed; with a change of state, the row as it committed. */
interface Applied {
  n: number;
  row?: SandboxRecord;
}

const changesState = (patch: SandboxPatch) => patch.state !== undefined || patch.desiredState !== undefined;

export class SandboxStore {
  readonly #orm: MikroORM;
  /** Told the id of every sandbox whose row this store wrote (caches of rows listen). */
  onWrite: (id: string) => void = () => undefined;

  constructor(orm: MikroORM) {
    this.#orm = orm;
  }

  #em() {
    return this.#orm.em.fork();
  }

  /**
   * Inserts a new sandbox once the organization's quota admits it (one transaction); `place`
   * picks its runner in that transaction (so two control processes never over-commit one).
   * `held`, when given, is awaited before the commit (the row becomes visible to other processes
   * only with the operation lock it names held); when it rejects, nothing is inserted.
   */
  async insert(row: SandboxRecord, place?: (exec: Exec) => Promise<string>, held?: Promise<void>): Promise<void> {
    try {
      await this.#em().transactional(async (em) => {
        await admit(execIn(em), row.organizationId, row.regionId, row);
        if (place) row.runnerId = await place(execIn(em));
        await lockForMount(execIn(em), [...new Set(row.volumes.map((v) => v.volumeId))]);
        await em.insert(SandboxRecord, row);
        await recordSandboxCreated(execIn(em), row);
        await held;
      });
    } catch (err) {
      if ((err as { code?: string }).code === "23505" || /unique/i.test(String(err))) {
        throw errors.alreadyExists(`Sandbox with name ${row.name} already exists`);
      }
      throw err;
    }
  }

  /** Captured layers some sandbox (not destroyed) or snapshot names (layer-capture.ts's sweep keeps them). */
  async layersInUse(): Promise<Set<string>> {
    const rows = (await execIn(this.#em())(
      `select jsonb_array_elements_text(layers) as id from sandbox where layers is not null and state <> 'destroyed'
       union select jsonb_array_elements_text(layers) from snapshot where layers is not null`,
      [],
    )) as Array<{ id: string }>;
    return new Set(rows.map((r) => r.id));
  }

  /** Removes snapshots of running sandboxes a crash left pending (each is made within one operation). */
  async dropUnfinishedLayerSnapshots(): Promise<number> {
    const rows = (await execIn(this.#em())(`delete from snapshot where layers is not null and state = 'pending' returning id`, [])) as unknown[];
    return rows.length;
  }

  /** The organization's sandboxes forked from `parentId`, oldest first. */
  forksOf(organizationId: string, parentId: string, includeDestroyed: boolean): Promise<SandboxRecord[]> {
    return this.#em().find(SandboxRecord, { organizationId, parentId, ...(includeDestroyed ? {} : VISIBLE) }, { orderBy: { createdAt: "asc" } });
  }

  /** Any row by id, destroyed ones included. */
  async byId(id: string): Promise<SandboxRecord | null> {
    if (!isUuid(id)) return null;
    return this.#em().findOne(SandboxRecord, { id });
  }

  /** The organization's sandbox by id, else by name; unknown, destroyed and other organizations' are 404. */
  async find(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    const em = this.#em();
    const rows = await em.find(SandboxRecord, {
      organizationId,
      ...VISIBLE,
      $or: isUuid(idOrName) ? [{ id: idOrName }, { name: idOrName }] : [{ name: idOrName }],
    });
    const row = rows.find((r) => r.id === idOrName) ?? rows[0];
    if (!row) throw errors.notFound(`Sandbox with ID or name ${idOrName} not found`);
    return row;
  }

  /**
   * A sandbox of the organization deleted (by id) less than `graceMs` ago, or null: reads by id
   * still show it as destroyed for a while, as the reference's do (its 0.25 client reads the
   * sandbox right after deleting it). Lists and every other operation no longer see it.
   */
  async recentlyDeleted(organizationId: string, id: string, graceMs: number): Promise<SandboxRecord | null> {
    if (!isUuid(id)) return null;
    return this.#em().findOne(SandboxRecord, { id, organizationId, desiredState: "destroyed", updatedAt: { $gte: new Date(Date.now() - graceMs) } });
  }

  /**
   * A change of state answers the row as it committed (read under its row lock, the patch
   * applied), which lets an operation answer without reading it again; other changes undefined.
   */
  async update(id: string, patch: SandboxPatch): Promise<SandboxRecord | undefined> {
    return (await this.#write(id, {}, patch)).row;
  }

  /**
   * `update`, once the organization's quota admits what the change adds (starting or resizing a sandbox; see
   * `admit`, which also checks `size` against the per-sandbox limits); `place` picks its runner in that
   * transaction (patch.runnerId).
   */
  async updateAdmitted(row: SandboxRecord, demand: Demand, patch: SandboxPatch, extra: { size?: Demand; place?: (exec: Exec) => Promise<string> } = {}): Promise<void> {
    try {
      await this.#em().transactional(async (em) => {
        await admit(execIn(em), row.organizationId, row.regionId, demand, extra.size);
        if (extra.place) patch.runnerId = await extra.place(execIn(em));
        await this.#apply(em, row.id, {}, patch);
      });
    } finally {
      this.onWrite(row.id);
    }
  }

  /** Updates only while `where` holds; says whether it did. */
  async updateIf(id: string, where: Record<string, unknown>, patch: SandboxPatch): Promise<boolean> {
    return (await this.#write(id, where, patch)).n > 0;
  }

  /** A change of state runs in a transaction of its own (for its event); others are one statement. */
  async #write(id: string, where: Record<string, unknown>, patch: SandboxPatch): Promise<Applied> {
    try {
      if (!changesState(patch)) return await this.#apply(this.#em(), id, where, patch);
      return await this.#em().transactional((em) => this.#apply(em, id, where, patch));
    } finally {
      this.onWrite(id);
    }
  }

  async #apply(em: EntityManager, id: string, where: Record<string, unknown>, patch: SandboxPatch): Promise<Applied> {
    const exec = execIn(em);
    let before: SandboxRecord | undefined;
    if (changesState(patch)) {
      // The whole row (one round trip either way): what the event names it left, and the row the change answers.
      const rows = (await exec(`select * from sandbox where id = ? for update`, [id])) as EntityDictionary<SandboxRecord>[];
      if (rows[0]) before = em.map(SandboxRecord, rows[0]);
    }
    const updatedAt = new Date();
    const n = await em.nativeUpdate(SandboxRecord, { id, ...where }, { ...patch, updatedAt });
    if (n > 0 && before) {
      const after = { state: patch.state ?? before.state, desiredState: patch.desiredState ?? before.desiredState };
      await recordSandboxStateChange(exec, id, before.organizationId, before, after, updatedAt);
      return { n, row: { ...before, ...patch, updatedAt } as SandboxRecord };
    }
    return { n };
  }

  /** Activity stamp: no updatedAt change, and nothing for destroyed rows. */
  async touch(id: string, at: Date): Promise<void> {
    await this.#em().nativeUpdate(SandboxRecord, { id, state: { $ne: "destroyed" } }, { lastActivityAt: at });
  }

  /**
   * Rows a runner answers for: those it holds, plus unheld ones an operation left unfinished
   * (an archived sandbox being deleted). Destroyed rows are done.
   */
  async ofRunner(runnerId: string): Promise<SandboxRecord[]> {
    return this.#em().find(SandboxRecord, {
      $or: [{ runnerId }, { runnerId: null, state: { $ne: "archived" } }, { runnerId: null, state: "archived", desiredState: { $ne: "archived" } }],
      state: { $ne: "destroyed" },
    });
  }

  /**
   * Organizations whose suspension has outlasted its cleanup grace period (hours of `minuteMs`
   * minutes): their sandboxes are stopped.
   */
  async suspendedPastGrace(now: Date, minuteMs: number): Promise<Set<string>> {
    const rows = (await execIn(this.#em())(
      `select id from organization
        where suspended and (suspended_until is null or suspended_until > ?)
          and suspended_at + suspension_cleanup_grace_period_hours * 60 * ? * interval '1 millisecond' <= ?`,
      [now, minuteMs, now],
    )) as Array<{ id: string }>;
    return new Set(rows.map((r) => r.id));
  }

  /** Archived sandboxes (held by no runner) that have an auto-delete interval. */
  async archivedWithAutoDelete(): Promise<SandboxRecord[]> {
    return this.#em().find(SandboxRecord, { state: "archived", desiredState: "archived", runnerId: null, autoDeleteInterval: { $gte: 0 } });
  }

  /** Sandboxes whose TTL has run out (autoDestroyAt at or before `now`) and that are not being deleted already. */
  async pastAutoDestroy(now: Date): Promise<SandboxRecord[]> {
    return this.#em().find(SandboxRecord, { autoDestroyAt: { $lte: now }, state: { $ne: "destroyed" }, desiredState: { $ne: "destroyed" } });
  }

  /** Rows by id, destroyed ones included (for reconciliation against a host's list). */
  async byIds(ids: string[]): Promise<SandboxRecord[]> {
    if (ids.length === 0) return [];
    return this.#em().find(SandboxRecord, { id: { $in: ids.filter(isUuid) } });
  }

  async list(f: ListFilter): Promise<SandboxRecord[]> {
    const em = this.#em();
    const rows = await em.execute<EntityDictionary<SandboxRecord>[]>(`select * from "sandbox" where ${f.where} order by ${f.orderBy}${f.limit ? ` limit ${f.limit}` : ""}${f.offset ? ` offset ${f.offset}` : ""}`, f.params, "all");
    return rows.map((r) => em.map(SandboxRecord, r));
  }

  async count(f: ListFilter): Promise<number> {
    const [row] = (await this.#em().execute(`select count(*)::int as n from "sandbox" where ${f.where}`, f.params, "all")) as Array<{ n: number }>;
    return row.n;
  }

  /** Destroyed rows older than `before` are removed for good (the reference keeps them 24 h). */
  async purgeDestroyed(before: Date): Promise<number> {
    return this.#em().nativeDelete(SandboxRecord, { state: "destroyed", updatedAt: { $lt: before } });
  }
}
