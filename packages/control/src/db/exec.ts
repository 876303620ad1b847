import type { EntityManager } from "@mikro-orm/postgresql";

/** Runs one SQL statement (`?` placeholders) inside the caller's transaction; answers the rows. */
export type Exec = (sql: string, params: unknown[]) => Promise<unknown>;

/** An entity manager (in a transaction or not) as an Exec. */
export function execIn(em: EntityManager): Exec {
  return (sql, params) => em.getConnection().execute(sql, params, "all", em.getTransactionContext());
}

/** A pg client as an Exec (pg numbers its placeholders). */
export function pgExec(client: { query(sql: string, params: unknown[]): Promise<{ rows: unknown[] }> }): Exec {
  return async (sql, params) => {
    let n = 0;
    return (await client.query(sql.replace(/\?/g, () => `$${++n}`), params)).rows;
  };
}

/** A PostgreSQL array literal for a `?::text[]` (or `::uuid[]`) parameter. */
export function pgArray(values: readonly string[]): string {
  return `{${values.map((v) => `"${v.replace(/["\\]/g, (c) => `\\${c}`)}"`).join(",")}}`;
}

/** A timestamp column of a raw row: MikroORM's connection answers them as strings. */
export function dateOf(v: Date | string): Date {
  return v instanceof Date ? v : new Date(v);
}
