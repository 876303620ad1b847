import { randomBytes } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { type Region as RegionDto, RegionSchema, type RegionService, RegionType } from "@sandbar/protocol/gen/sandbar/control/v1/region_pb.js";
import { generateApiKey, hashApiKey } from "../auth/key-material.ts";
import { organizationOf } from "../call/call.ts";
import { execIn } from "../db/exec.ts";
import { Region } from "../db/entities.ts";
import { Checks } from "./validate.ts";

// Regions: the shared ones every organization may use (the local region of this host), and an
// organization's own custom regions, whose service credentials (proxy, SSH gateway, snapshot
// manager) are answered once and stored only as SHA-256 hashes.

const NAME = /^[a-zA-Z0-9_.-]+$/;
const TYPES: Record<string, RegionType> = { shared: RegionType.SHARED, dedicated: RegionType.DEDICATED, custom: RegionType.CUSTOM };
const ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";
const SNAPSHOT_MANAGER_USER = "sandbar";

type Urls = { proxyUrl?: string; sshGatewayUrl?: string; snapshotManagerUrl?: string };
const URL_FIELDS = ["proxyUrl", "sshGatewayUrl", "snapshotManagerUrl"] as const;

export function regionService(orm: MikroORM): Partial<ServiceImpl<typeof RegionService>> {
  const em = () => orm.em.fork();

  /** Only the organization's own custom regions are addressable by id; anything else does not exist here. */
  async function own(organizationId: string, id: string, fork = em()): Promise<Region> {
    const region = await fork.findOne(Region, { id, organizationId, regionType: "custom" });
    if (!region) throw errors.notFound("Region not found");
    return region;
  }

  return {
    async listRegions(_req, ctx) {
      const organizationId = organizationOf(ctx);
      const rows = (await execIn(em())(
        `select r.id from region r
          where r.organization_id = ?
             or (r.region_type in ('shared', 'dedicated') and (not r.enforce_quotas
                 or exists (select 1 from region_quota q where q.region_id = r.id and q.organization_id = ?)))
          order by case r.region_type when 'custom' then 0 when 'dedicated' then 1 else 2 end, r.name`,
        [organizationId, organizationId],
      )) as Array<{ id: string }>;
      const regions = await em().find(Region, { id: { $in: rows.map((r) => r.id) } });
      const order = new Map(rows.map((r, i) => [r.id, i]));
      return { items: regions.sort((a, b) => order.get(a.id)! - order.get(b.id)!).map(toRegion) };
    },

    async listSharedRegions() {
      return { items: (await em().find(Region, { regionType: "shared" }, { orderBy: { name: "asc" } })).map(toRegion) };
    },

    async createRegion(req, ctx) {
      const organizationId = organizationOf(ctx);
      const name = req.name.trim();
      if (!NAME.test(name)) throw errors.invalidArgument("Region name must contain only letters, numbers, underscores, periods, and hyphens");
      // The reference's check is < 2 or > 255 under a message that says 3: kept as it is.
      if (name.length < 2 || name.length > 255) throw errors.invalidArgument("Region name must be between 3 and 255 characters");
      checkUrls(req);
      const secrets = credentialsFor(req);
      const fork = em();
      try {
        await fork.insert(Region, {
          id: `${name.toLowerCase()}_${randomId(4)}`,
          name,
          organizationId,
          regionType: "custom",
          enforceQuotas: false,
          proxyUrl: req.proxyUrl || null,
          sshGatewayUrl: req.sshGatewayUrl || null,
          snapshotManagerUrl: req.snapshotManagerUrl || null,
          proxyApiKeyHash: secrets.proxyApiKey ? hashApiKey(secrets.proxyApiKey) : null,
          sshGatewayApiKeyHash: secrets.sshGatewayApiKey ? hashApiKey(secrets.sshGatewayApiKey) : null,
          snapshotManagerPasswordHash: secrets.snapshotManagerPassword ? hashApiKey(secrets.snapshotManagerPassword) : null,
          createdAt: new Date(),
          updatedAt: new Date(),
        });
      } catch (err) {
        // Names are unique across every region; two creates at once both get here, one as a 409.
        if ((err as { code?: string }).code === "23505" || /unique/i.test(String(err))) throw errors.alreadyExists(`Region with name ${name} already exists`);
        throw err;
      }
      const row = await fork.findOneOrFail(Region, { name });
      return { id: row.id, ...secrets };
    },

    async getRegion(req, ctx) {
      return toRegion(await own(organizationOf(ctx), req.id));
    },

    async updateRegion(req, ctx) {
      checkUrls(req);
      const fork = em();
      const region = await own(organizationOf(ctx), req.id, fork);
      // A service that gets a URL gets a credential (answered by its regenerate route); one whose
      // URL is cleared loses it.
      for (const field of URL_FIELDS) {
        const value = req[field];
        if (value === undefined) continue;
        region[field] = value || null;
      }
      if (!region.proxyUrl) region.proxyApiKeyHash = null;
      if (!region.sshGatewayUrl) region.sshGatewayApiKeyHash = null;
      if (!region.snapshotManagerUrl) region.snapshotManagerPasswordHash = null;
      await fork.flush();
      return {};
    },

    async deleteRegion(req, ctx) {
      const organizationId = organizationOf(ctx);
      await em().transactional(async (tx) => {
        const region = await own(organizationId, req.id, tx);
        const exec = execIn(tx);
        const [{ n }] = (await exec(`select count(*)::int as n from sandbox where region_id = ? and state <> 'destroyed'`, [region.id])) as Array<{ n: number }>;
        if (n > 0) throw errors.invalidArgument(`Cannot delete region which has sandboxes in it (${n}): delete them first`);
        const [{ d }] = (await exec(`select count(*)::int as d from organization where default_region_id = ?`, [region.id])) as Array<{ d: number }>;
        if (d > 0) throw errors.invalidArgument("Cannot delete region which is the default region of an organization");
        await exec(`delete from sandbox where region_id = ?`, [region.id]); // destroyed rows kept for reads only
        await exec(`delete from region where id = ?`, [region.id]);
      });
      return {};
    },

    async regenerateProxyApiKey(req, ctx) {
      const fork = em();
      const region = await own(organizationOf(ctx), req.id, fork);
      if (!region.proxyUrl) throw errors.invalidArgument("Region does not have a proxy URL configured");
      const apiKey = generateApiKey();
      region.proxyApiKeyHash = hashApiKey(apiKey);
      await fork.flush();
      return { apiKey };
    },

    async regenerateSshGatewayApiKey(req, ctx) {
      const fork = em();
      const region = await own(organizationOf(ctx), req.id, fork);
      if (!region.sshGatewayUrl) throw errors.invalidArgument("Region does not have an SSH gateway URL configured");
      const apiKey = generateApiKey();
      region.sshGatewayApiKeyHash = hashApiKey(apiKey);
      await fork.flush();
      return { apiKey };
    },

    async regenerateSnapshotManagerCredentials(req, ctx) {
      const fork = em();
      const region = await own(organizationOf(ctx), req.id, fork);
      if (!region.snapshotManagerUrl) throw errors.invalidArgument("Region does not have a snapshot manager URL configured");
      const password = randomBytes(16).toString("hex");
      region.snapshotManagerPasswordHash = hashApiKey(password);
      await fork.flush();
      return { username: SNAPSHOT_MANAGER_USER, password };
    },
  };
}

/** http(s) URLs only; an empty string clears (on update). */
function checkUrls(req: Urls): void {
  const checks = new Checks();
  for (const field of URL_FIELDS) {
    const value = req[field];
    if (!value) continue;
    let ok = false;
    try {
      ok = /^https?:$/.test(new URL(value).protocol);
    } catch {
      ok = false;
    }
    checks.that(ok && value.length <= 2048, `${field} must be an http(s) URL`);
  }
  checks.done();
}

/** A secret for each service whose URL is given: shown in the create answer only. */
function credentialsFor(req: Urls) {
  return {
    proxyApiKey: req.proxyUrl ? generateApiKey() : undefined,
    sshGatewayApiKey: req.sshGatewayUrl ? generateApiKey() : undefined,
    snapshotManagerUsername: req.snapshotManagerUrl ? SNAPSHOT_MANAGER_USER : undefined,
    snapshotManagerPassword: req.snapshotManagerUrl ? randomBytes(16).toString("hex") : undefined,
  };
}

function randomId(n: number): string {
  let out = "";
  for (const b of randomBytes(n)) out += ID_ALPHABET[b % ID_ALPHABET.length];
  return out;
}

function toRegion(r: Region): RegionDto {
  return create(RegionSchema, {
    id: r.id,
    name: r.name,
    organizationId: r.organizationId ?? undefined,
    regionType: TYPES[r.regionType] ?? RegionType.UNSPECIFIED,
    createdAt: timestampFromDate(r.createdAt),
    updatedAt: timestampFromDate(r.updatedAt),
    proxyUrl: r.proxyUrl ?? undefined,
    sshGatewayUrl: r.sshGatewayUrl ?? undefined,
    snapshotManagerUrl: r.snapshotManagerUrl ?? undefined,
  });
}
