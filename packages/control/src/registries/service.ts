import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import type { DockerRegistryService } from "@sandbar/protocol/gen/sandbar/control/v1/registry_pb.js";
import { authOf, organizationOf } from "../call/call.ts";
import type { SecretBox } from "../auth/secret-box.ts";
import { type Exec, execIn } from "../db/exec.ts";
import { targetRegion } from "../organizations/target-region.ts";
import type { InternalRegistry } from "./internal/index.ts";
import { PUBLIC_COLUMNS, type RegistryRow, toDockerRegistry } from "./rows.ts";
import { checkRegistryInput } from "./validate.ts";

// An organization's container registries (spec 4.9): CRUD and its one default. Only rows of type
// "organization" are the organization's to see; the password is sealed before it reaches SQL and
// never read back here (registryCredentialsFor opens it for pulls).

/** The reference's cap per organization. */
export const MAX_REGISTRIES_PER_ORGANIZATION = 100;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

type Row = Omit<RegistryRow, "password_sealed">;

/** The internal registry, or why there is none (push access then answers 503 with it). */
export interface PushRegistry {
  registry?: InternalRegistry;
  reason: string;
}

export function dockerRegistryService(orm: MikroORM, box: SecretBox, internal: PushRegistry = { reason: "The internal registry is off on this server" }): Partial<ServiceImpl<typeof DockerRegistryService>> {
  const em = () => orm.em.fork();

  /** The organization's own registry, else the reference's 404 (any other id looks the same). */
  async function own(exec: Exec, organizationId: string, id: string, lock = false): Promise<Row> {
    const rows = UUID.test(id)
      ? ((await exec(
          `select ${PUBLIC_COLUMNS} from docker_registry where id = ? and organization_id = ? and registry_type = 'organization'${lock ? " for update" : ""}`,
          [id, organizationId],
        )) as Row[])
      : [];
    if (!rows[0]) throw errors.notFound(`Docker registry with ID ${id} not found`);
    return rows[0];
  }

  /** Serializes the organization's registry changes (the cap and the one default). */
  const lockOrganization = (exec: Exec, organizationId: string) => exec(`select 1 from organization where id = ? for update`, [organizationId]);

  return {
    async createRegistry(req, ctx) {
      const organizationId = organizationOf(ctx);
      const input = checkRegistryInput(req, true);
      const sealed = box.seal(input.password!);
      const row = await em().transactional(async (tx) => {
        const exec = execIn(tx);
        await lockOrganization(exec, organizationId);
        const [{ n }] = (await exec(`select count(*)::int as n from docker_registry where organization_id = ? and registry_type = 'organization'`, [organizationId])) as Array<{ n: number }>;
        if (n >= MAX_REGISTRIES_PER_ORGANIZATION) throw errors.invalidArgument("You have reached the maximum number of registries");
        const rows = (await exec(
          `insert into docker_registry (organization_id, name, url, username, password_sealed, project, registry_type)
           values (?, ?, ?, ?, ?, ?, 'organization') returning ${PUBLIC_COLUMNS}`,
          [organizationId, input.name, input.url.url, input.username, sealed, input.project ?? ""],
        )) as Row[];
        return rows[0]!;
      });
      return toDockerRegistry(row);
    },

    async listRegistries(_req, ctx) {
      const rows = (await execIn(em())(
        `select ${PUBLIC_COLUMNS} from docker_registry where organization_id = ? and registry_type = 'organization' order by created_at desc, id desc`,
        [organizationOf(ctx)],
      )) as Row[];
      return { items: rows.map(toDockerRegistry) };
    },

    async getRegistryPushAccess(req, ctx) {
      const organizationId = organizationOf(ctx);
      // Either scope will do, as the reference's; a route holds only one, so it is checked here.
      const permissions = authOf(ctx).permissions;
      if (!permissions?.has("write:snapshots") && !permissions?.has("write:sandboxes")) throw errors.permissionDenied("Access denied");
      // One registry serves every region of this host; an unknown region is still refused.
      await targetRegion(orm, organizationId, req.regionId || undefined);
      if (!internal.registry) throw errors.unavailable(internal.reason);
      return internal.registry.pushAccess(organizationId);
    },

    async getRegistry(req, ctx) {
      return toDockerRegistry(await own(execIn(em()), organizationOf(ctx), req.id));
    },

    async updateRegistry(req, ctx) {
      const organizationId = organizationOf(ctx);
      const input = checkRegistryInput(req, false);
      const sealed = input.password !== undefined ? box.seal(input.password) : null;
      const row = await em().transactional(async (tx) => {
        const exec = execIn(tx);
        await own(exec, organizationId, req.id, true);
        // An absent password or project stays as it is (the reference's PATCH).
        const rows = (await exec(
          `update docker_registry set name = ?, url = ?, username = ?,
                  password_sealed = coalesce(?, password_sealed), project = coalesce(?, project), updated_at = clock_timestamp()
            where id = ? returning ${PUBLIC_COLUMNS}`,
          [input.name, input.url.url, input.username, sealed, input.project ?? null, req.id],
        )) as Row[];
        return rows[0]!;
      });
      return toDockerRegistry(row);
    },

    async deleteRegistry(req, ctx) {
      const organizationId = organizationOf(ctx);
      await em().transactional(async (tx) => {
        const exec = execIn(tx);
        await own(exec, organizationId, req.id, true);
        await exec(`delete from docker_registry where id = ?`, [req.id]);
      });
      return {};
    },

    async setDefaultRegistry(req, ctx) {
      const organizationId = organizationOf(ctx);
      const row = await em().transactional(async (tx) => {
        const exec = execIn(tx);
        await lockOrganization(exec, organizationId);
        await own(exec, organizationId, req.id);
        // The previous default steps down in the same transaction; the partial unique index
        // refuses a second default should anything else ever try.
        await exec(`update docker_registry set is_default = false, updated_at = clock_timestamp() where organization_id = ? and is_default and id <> ?`, [organizationId, req.id]);
        const rows = (await exec(`update docker_registry set is_default = true, updated_at = clock_timestamp() where id = ? returning ${PUBLIC_COLUMNS}`, [req.id])) as Row[];
        return rows[0]!;
      });
      return toDockerRegistry(row);
    },
  };
}
