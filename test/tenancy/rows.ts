/**
 * Everything stored about B, read straight from PostgreSQL: in every table, the rows whose `id`
 * or any `*_id` column names one of B's ids. Taken before and after the sweep, the two must be
 * equal: a call that changed B (a role renamed, a key revoked, a sandbox stopped, a region's
 * credentials regenerated) shows here even if it answered 404. New tables are covered as they come.
 */
import type { TestServer } from "../../packages/control/src/testing/server.ts";

/**
 * The audit log records every caller's attempts in the caller's own organization, naming B's ids
 * as targets: only B's own log (its organization_id) is B's. An entry landing there is a change.
 */
const BY_ORGANIZATION_ONLY: Record<string, string[]> = { audit_log: ["organization_id"] };

/** Written by B's own running sandbox and the server's timers, not by callers. */
const VOLATILE = new Set(["last_activity_at", "last_heartbeat_at", "last_seen_at"]);

export async function rowsOf(t: TestServer, ids: string[]): Promise<Record<string, unknown[]>> {
  const exec = (sql: string, params: unknown[] = []) => t.server.orm.em.getConnection().execute(sql, params);
  const columns = (await exec(
    `select table_name, column_name from information_schema.columns
      where table_schema = current_schema() and (column_name = 'id' or column_name like '%\\_id')
      order by table_name, column_name`,
  )) as Array<{ table_name: string; column_name: string }>;
  const byTable = new Map<string, string[]>();
  for (const c of columns) byTable.set(c.table_name, [...(byTable.get(c.table_name) ?? []), c.column_name]);
  const out: Record<string, unknown[]> = {};
  for (const [table, all] of byTable) {
    if (table.startsWith("mikro_orm")) continue;
    const cols = BY_ORGANIZATION_ONLY[table] ?? all;
    const where = cols.map((c) => `"${c}"::text = any(?::text[])`).join(" or ");
    const rows = (await exec(`select * from "${table}" where ${where}`, cols.map(() => `{${ids.map((i) => `"${i}"`).join(",")}}`))) as Array<Record<string, unknown>>;
    if (!rows.length) continue;
    out[table] = rows
      .map((r) => JSON.stringify(Object.fromEntries(Object.entries(r).filter(([k]) => !VOLATILE.has(k)))))
      .sort()
      .map((s) => JSON.parse(s));
  }
  return out;
}
