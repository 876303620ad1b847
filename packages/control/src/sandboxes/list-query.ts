import { errors } from "@sandbar/protocol";
import { Checks, isWellFormed } from "../services/validate.ts";
import { REPORTED_STATE_SQL } from "./states.ts";

// The two sandbox lists as SQL: the cursor list (GET /sandbox) and the page-numbered one
// (GET /sandbox/paginated), with the reference's filters and their messages.

export interface ListFilter {
  where: string;
  params: unknown[];
  orderBy: string;
  limit?: number;
  offset?: number;
}

export interface ListCriteria {
  organizationId: string;
  idPrefix?: string;
  namePrefix?: string;
  /** JSON-encoded object; a sandbox matches when its labels contain every pair. */
  labels?: string;
  includeErroredDeleted?: boolean;
  /** Reported states (JSON spelling). */
  states: string[];
  snapshots: string[];
  regions: string[];
  classes: string[];
  minCpu?: number;
  maxCpu?: number;
  minMemoryGiB?: number;
  maxMemoryGiB?: number;
  minDiskGiB?: number;
  maxDiskGiB?: number;
  isPublic?: boolean;
  isRecoverable?: boolean;
  createdAtAfter?: Date;
  createdAtBefore?: Date;
  lastEventAfter?: Date;
  lastEventBefore?: Date;
}

/** A sandbox's class when none is asked for. */
export const SANDBOX_CLASS = "container";

const LIMIT_MAX = 200;

const likePrefix = (s: string) => s.replace(/[\\%_]/g, (c) => `\\${c}`) + "%";

export function whereOf(c: ListCriteria, checks: Checks, allStates: string[]): { where: string; params: unknown[] } {
  const where: string[] = [`"organization_id" = ?`, `"state" <> 'destroyed'`];
  const params: unknown[] = [c.organizationId];
  const add = (sql: string, ...values: unknown[]) => {
    where.push(sql);
    params.push(...values);
  };
  if (!c.includeErroredDeleted) where.push(`not ("state" in ('error', 'build_failed') and "desired_state" = 'destroyed')`);
  if (c.idPrefix) add(`cast("id" as text) ilike ? escape '\\'`, likePrefix(c.idPrefix));
  if (c.namePrefix) add(`"name" ilike ? escape '\\'`, likePrefix(c.namePrefix));
  if (c.labels !== undefined) {
    let labels: unknown;
    try {
      labels = JSON.parse(c.labels);
    } catch {
      labels = undefined;
    }
    if (typeof labels !== "object" || labels === null || Array.isArray(labels)) throw errors.invalidArgument("Invalid labels JSON format");
    // PostgreSQL's jsonb refuses \u0000 and lone surrogates: the filter's problem, not the server's.
    if (badText(labels)) throw errors.invalidArgument("labels must not contain NUL characters or invalid Unicode");
    add(`"labels" @> cast(? as jsonb)`, JSON.stringify(labels));
  }
  if (c.states.length) {
    const allowed = allStates.filter((s) => s !== "destroyed");
    checks.that(c.states.every((s) => allowed.includes(s)), `each value in states must be one of the following values: ${allowed.join(", ")}`);
    add(`${REPORTED_STATE_SQL} in (${c.states.map(() => "?").join(", ")})`, ...c.states);
  }
  if (c.snapshots.length) add(`"snapshot" in (${c.snapshots.map(() => "?").join(", ")})`, ...c.snapshots);
  if (c.regions.length) add(`"region_id" in (${c.regions.map(() => "?").join(", ")})`, ...c.regions);
  if (c.classes.length) add(`"sandbox_class" in (${c.classes.map(() => "?").join(", ")})`, ...c.classes);
  const range = (name: string, column: string, value: number | undefined, op: ">=" | "<=") => {
    if (value === undefined) return;
    checks.that(value >= 1, `${name} must not be less than 1`);
    add(`"${column}" ${op} ?`, value);
  };
  range("minCpu", "cpu", c.minCpu, ">=");
  range("maxCpu", "cpu", c.maxCpu, "<=");
  range("minMemoryGiB", "memory", c.minMemoryGiB, ">=");
  range("maxMemoryGiB", "memory", c.maxMemoryGiB, "<=");
  range("minDiskGiB", "disk", c.minDiskGiB, ">=");
  range("maxDiskGiB", "disk", c.maxDiskGiB, "<=");
  if (c.isPublic !== undefined) add(`"public" = ?`, c.isPublic);
  // Recoverable: in `error` with its files intact on its host (recover or start brings it back).
  if (c.isRecoverable !== undefined) where.push(`${c.isRecoverable ? "" : "not "}("state" = 'error' and "recoverable")`);
  if (c.createdAtAfter) add(`"created_at" >= ?`, c.createdAtAfter);
  if (c.createdAtBefore) add(`"created_at" <= ?`, c.createdAtBefore);
  if (c.lastEventAfter) add(`"last_activity_at" >= ?`, c.lastEventAfter);
  if (c.lastEventBefore) add(`"last_activity_at" <= ?`, c.lastEventBefore);
  return { where: where.join(" and "), params };
}

/** Whether any key or string in a JSON value holds NUL or a lone surrogate. */
function badText(v: unknown): boolean {
  if (typeof v === "string") return v.includes("\u0000") || !isWellFormed(v);
  if (Array.isArray(v)) return v.some(badText);
  if (typeof v === "object" && v !== null) return Object.entries(v).some(([k, x]) => badText(k) || badText(x));
  return false;
}

export function checkLimit(checks: Checks, limit: number | undefined): number {
  if (limit === undefined) return 100;
  checks.that(limit >= 1, "limit must not be less than 1").that(limit <= LIMIT_MAX, `limit must not be greater than ${LIMIT_MAX}`);
  return limit;
}

// ---- cursor list ----

export type CursorSort = "name" | "cpu" | "memoryGib" | "diskGib" | "lastActivityAt" | "createdAt";

const CURSOR_SORT: Record<CursorSort, { sql: string; kind: "text" | "number" | "time" }> = {
  name: { sql: `"name"`, kind: "text" },
  cpu: { sql: `"cpu"`, kind: "number" },
  memoryGib: { sql: `"memory"`, kind: "number" },
  diskGib: { sql: `"disk"`, kind: "number" },
  lastActivityAt: { sql: `coalesce("last_activity_at", "created_at")`, kind: "time" },
  createdAt: { sql: `"created_at"`, kind: "time" },
};

/** The value a row is sorted by, as it goes into a cursor. */
export function sortValueOf(sort: CursorSort, row: { name: string; cpu: number; memory: number; disk: number; lastActivityAt?: Date | null; createdAt: Date }): string | number {
  switch (sort) {
    case "name":
      return row.name;
    case "cpu":
      return row.cpu;
    case "memoryGib":
      return row.memory;
    case "diskGib":
      return row.disk;
    case "lastActivityAt":
      return (row.lastActivityAt ?? row.createdAt).toISOString();
    case "createdAt":
      return row.createdAt.toISOString();
  }
}

export function encodeCursor(sortValue: string | number, id: string): string {
  return Buffer.from(JSON.stringify({ sortValue, id })).toString("base64");
}

/** Sorted by `sort` then id, both in `order`; one row more than `limit` tells whether more exist. */
export function cursorPage(base: { where: string; params: unknown[] }, sort: CursorSort, order: "asc" | "desc", cursor: string | undefined, limit: number): ListFilter {
  const { sql, kind } = CURSOR_SORT[sort];
  const where = [base.where];
  const params = [...base.params];
  if (cursor !== undefined) {
    const c = decodeCursor(cursor, kind);
    const op = order === "asc" ? ">" : "<";
    const cast = kind === "time" ? "cast(? as timestamptz)" : "?";
    where.push(`(${sql} ${op} ${cast} or (${sql} = ${cast} and "id" ${op} cast(? as uuid)))`);
    params.push(c.sortValue, c.sortValue, c.id);
  }
  return { where: where.join(" and "), params, orderBy: `${sql} ${order}, "id" ${order}`, limit: limit + 1 };
}

function decodeCursor(cursor: string, kind: "text" | "number" | "time"): { sortValue: string | number; id: string } {
  const bad = () => errors.invalidArgument(`Invalid cursor provided: ${cursor}`);
  let c: { sortValue?: unknown; id?: unknown };
  try {
    c = JSON.parse(Buffer.from(cursor, "base64").toString("utf8")) as typeof c;
  } catch {
    throw bad();
  }
  if (typeof c !== "object" || c === null || typeof c.id !== "string" || !/^[0-9a-f-]{36}$/i.test(c.id)) throw bad();
  const v = c.sortValue;
  if (kind === "number" ? typeof v !== "number" : typeof v !== "string") throw bad();
  if (kind === "time" && Number.isNaN(Date.parse(v as string))) throw bad();
  return { sortValue: v as string | number, id: c.id };
}

// ---- page-numbered list ----

export type PageSort = "id" | "name" | "state" | "snapshot" | "region" | "updatedAt" | "createdAt" | "lastActivityAt";

const PAGE_SORT: Record<PageSort, string> = {
  id: `"id"`,
  name: `"name"`,
  state: REPORTED_STATE_SQL,
  snapshot: `"snapshot"`,
  region: `"region_id"`,
  updatedAt: `"updated_at"`,
  createdAt: `"created_at"`,
  lastActivityAt: `"last_activity_at"`,
};

export function pagePage(base: { where: string; params: unknown[] }, sort: PageSort, order: "asc" | "desc", page: number, limit: number): ListFilter {
  return {
    ...base,
    orderBy: `${PAGE_SORT[sort]} ${order} nulls last, "created_at" desc, "id" desc`,
    limit,
    offset: (page - 1) * limit,
  };
}
