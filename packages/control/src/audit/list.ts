import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { AuditLogSchema, PaginatedAuditLogsSchema } from "@sandbar/protocol/gen/sandbar/control/v1/audit_pb.js";
import { Checks } from "../services/validate.ts";

// The audit list as SQL, with the reference's query (page, limit 1..200, inclusive from/to on
// createdAt, nextToken) and its messages, plus exact filters. Newest first, by (created_at, id):
// the cursor is that pair of the page's last entry, so pages stay stable while entries arrive.

export interface AuditQuery {
  page?: number;
  limit?: number;
  from?: Timestamp;
  to?: Timestamp;
  nextToken?: string;
  actorId?: string;
  actorEmail?: string;
  action?: string;
  targetType?: string;
  targetId?: string;
}

const DEFAULT_LIMIT = 100;
const MAX_LIMIT = 200;
/** Offsets past this are refused for the cursor, as the reference does. */
const MAX_OFFSET_ROWS = 10_000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

interface Cursor {
  createdAt: Date;
  id: string;
}

/** base64url of JSON [createdAt, id]: opaque to clients. */
function encodeCursor(c: Cursor): string {
  return Buffer.from(JSON.stringify([c.createdAt.toISOString(), c.id])).toString("base64url");
}

function decodeCursor(token: string): Cursor {
  const invalid = (why: string) => errors.invalidArgument(`Invalid nextToken provided: ${why}`);
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw invalid("not a token this list handed out");
  }
  if (!Array.isArray(value) || value.length !== 2 || typeof value[0] !== "string" || typeof value[1] !== "string") throw invalid("not a token this list handed out");
  const createdAt = new Date(value[0]);
  if (Number.isNaN(createdAt.getTime()) || !UUID.test(value[1])) throw invalid("its position is malformed");
  return { createdAt, id: value[1] };
}

type AuditLogInit = MessageInitShape<typeof AuditLogSchema>;
type Page = MessageInitShape<typeof PaginatedAuditLogsSchema>;

interface Row {
  id: string;
  actor_id: string;
  actor_email: string;
  actor_api_key_prefix: string | null;
  actor_api_key_suffix: string | null;
  organization_id: string | null;
  action: string;
  target_type: string | null;
  target_id: string | null;
  status_code: number | null;
  error_message: string | null;
  ip_address: string | null;
  user_agent: string | null;
  source: string | null;
  metadata: Record<string, unknown> | string | null;
  /** ISO 8601 in UTC, to the millisecond (the driver hands raw timestamps back as text). */
  created_at_iso: string;
}

const COLUMNS = `*, to_char("created_at" at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as "created_at_iso"`;

const orUndefined = <T>(v: T | null): T | undefined => (v === null ? undefined : v);

function entryOf(r: Row): AuditLogInit {
  return {
    id: r.id,
    actorId: r.actor_id,
    actorEmail: r.actor_email,
    actorApiKeyPrefix: orUndefined(r.actor_api_key_prefix),
    actorApiKeySuffix: orUndefined(r.actor_api_key_suffix),
    organizationId: orUndefined(r.organization_id),
    action: r.action,
    targetType: orUndefined(r.target_type),
    targetId: orUndefined(r.target_id),
    statusCode: orUndefined(r.status_code),
    errorMessage: orUndefined(r.error_message),
    ipAddress: orUndefined(r.ip_address),
    userAgent: orUndefined(r.user_agent),
    source: orUndefined(r.source),
    metadata: (typeof r.metadata === "string" ? JSON.parse(r.metadata) : orUndefined(r.metadata)) as AuditLogInit["metadata"],
    createdAt: timestampFromDate(new Date(r.created_at_iso)),
  };
}

/** One page of entries; `organizationId` undefined: every organization's (the operator's view). */
export async function listAuditLogs(orm: MikroORM, organizationId: string | undefined, q: AuditQuery): Promise<Page> {
  const checks = new Checks();
  const page = q.page ?? 1;
  const limit = q.limit ?? DEFAULT_LIMIT;
  checks.that(page >= 1, "page must not be less than 1");
  checks.that(limit >= 1, "limit must not be less than 1").that(limit <= MAX_LIMIT, `limit must not be greater than ${MAX_LIMIT}`);
  checks.done();
  const cursor = q.nextToken ? decodeCursor(q.nextToken) : undefined;
  if (!cursor && page * limit > MAX_OFFSET_ROWS) {
    throw errors.invalidArgument(
      `Offset-based pagination not supported for page ${page} with limit ${limit}. Please use cursor-based pagination with nextToken parameter instead.`,
    );
  }

  const where: string[] = [];
  const params: unknown[] = [];
  const add = (sql: string, ...values: unknown[]) => {
    where.push(sql);
    params.push(...values);
  };
  if (organizationId !== undefined) add(`"organization_id" = ?`, organizationId);
  if (q.from) add(`"created_at" >= ?`, timestampDate(q.from));
  if (q.to) add(`"created_at" <= ?`, timestampDate(q.to));
  if (q.actorId !== undefined) add(`"actor_id" = ?`, q.actorId);
  if (q.actorEmail !== undefined) add(`"actor_email" = ?`, q.actorEmail);
  if (q.action !== undefined) add(`"action" = ?`, q.action);
  if (q.targetType !== undefined) add(`"target_type" = ?`, q.targetType);
  if (q.targetId !== undefined) add(`"target_id" = ?`, q.targetId);
  const filter = where.length ? `where ${where.join(" and ")}` : "";

  const db = orm.em.getConnection();
  const [{ n: total }] = (await db.execute(`select count(*)::int as "n" from "audit_log" ${filter}`, params, "all")) as [{ n: number }];
  // One row more than the page tells whether another page follows.
  const after = cursor ? `${filter ? `${filter} and` : "where"} ("created_at", "id") < (?, ?)` : filter;
  const rows = (await db.execute(
    `select ${COLUMNS} from "audit_log" ${after} order by "created_at" desc, "id" desc limit ${limit + 1}${cursor ? "" : ` offset ${(page - 1) * limit}`}`,
    cursor ? [...params, cursor.createdAt, cursor.id] : params,
    "all",
  )) as Row[];
  const more = rows.length > limit;
  const items = rows.slice(0, limit);
  const last = items[items.length - 1];
  return {
    items: items.map(entryOf),
    total,
    page,
    totalPages: Math.ceil(total / limit),
    nextToken: more && last ? encodeCursor({ createdAt: new Date(last.created_at_iso), id: last.id }) : undefined,
  };
}
