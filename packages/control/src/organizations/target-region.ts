import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";

/** Default regions by organization: set once and never changed (a second set is refused), so safe to keep. */
const defaults = new Map<string, string>();

/**
 * The region a new sandbox goes to: the `target` given (a region name, the organization's own
 * first, then shared ones, or an id), else the organization's default region.
 */
export async function targetRegion(orm: MikroORM, organizationId: string, target: string | undefined): Promise<string> {
  const conn = orm.em.getConnection();
  if (!target) {
    const known = defaults.get(organizationId);
    if (known) return known;
    const rows = (await conn.execute(`select default_region_id from organization where id = ?`, [organizationId])) as Array<{ default_region_id: string | null }>;
    const id = rows[0]?.default_region_id;
    if (!id) throw errors.invalidArgument("This organization does not have a default region. Set one with PATCH /organizations/{organizationId}/default-region.");
    if (defaults.size >= 10_000) defaults.clear();
    defaults.set(organizationId, id);
    return id;
  }
  const rows = (await conn.execute(
    `select id from region
      where (name = ? or id = ?) and (organization_id = ? or (organization_id is null and region_type <> 'custom'))
      order by (organization_id is null), (id = ?) desc limit 1`,
    [target, target, organizationId, target],
  )) as Array<{ id: string }>;
  if (!rows[0]) throw errors.notFound("Region not found");
  return rows[0].id;
}
