import { mkdir } from "node:fs/promises";
import path from "node:path";
import type { MikroORM } from "@mikro-orm/postgresql";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type RegistryPushAccess, RegistryPushAccessSchema } from "@sandbar/protocol/gen/sandbar/control/v1/registry_pb.js";
import { execIn } from "../../db/exec.ts";
import { freePort } from "@sandbar/runner/free-port";
import type { RegistryCredentials } from "../credentials.ts";
import { RegistryCredentialStore } from "./credentials.ts";
import { REGISTRY_SERVICE, type RegistryProcess, signingKey, startRegistryProcess, TOKEN_ISSUER } from "./registry-process.ts";
import type { InternalRegistrySettings } from "./settings.ts";
import { startTokenService } from "./token-service.ts";
import type { ForeignAdmission } from "../../call/chain.ts";

export { type InternalRegistrySettings } from "./settings.ts";

// The server's own registry (the reference's "transient" registry): users push images to their
// organization's namespace with short-lived credentials (registry-push-access), then make
// snapshots from them; the snapshot pull gets pull-only credentials of the same kind by itself.

/** Push access lasts an hour, as the reference's robot accounts. */
export const PUSH_ACCESS_SECONDS = 3600;
/** Pull accounts of snapshot pulls: valid 15 minutes, handed out again while 10 are left (a pull's budget). */
const PULL_ACCESS_SECONDS = 900;
const PULL_REUSE_MARGIN_MS = 600_000;
/** Build accounts: 3 hours, handed out again while 130 minutes are left (a build's 120-minute limit, then its push). */
const BUILD_ACCESS_SECONDS = 3 * 3600;
const BUILD_REUSE_MARGIN_MS = 130 * 60_000;

export interface InternalRegistry {
  /** "127.0.0.1:<port>": how image names in it start. */
  host: string;
  /** Whether `registry` (an image reference's host part) is this registry. */
  owns(registry: string): boolean;
  pushAccess(organizationId: string): Promise<RegistryPushAccess>;
  /** Pull-only credentials of the organization's namespace, for a snapshot pull. */
  pullCredentials(organizationId: string): Promise<RegistryCredentials>;
  /** Pull-and-push credentials of the organization's namespace for a runner's build (valid past the build's time limit). */
  buildCredentials(organizationId: string): Promise<RegistryCredentials>;
  stop(): Promise<void>;
}

/** The namespace (project) an organization pushes under: its id, a valid repository component. */
export const namespaceOf = (organizationId: string) => organizationId;

/**
 * Starts the registry and its token service; undefined (with the reason logged) when it is off
 * or cannot run here: push access then answers 503 with `reason`.
 */
export async function startInternalRegistry(
  settings: InternalRegistrySettings,
  dataDir: string,
  orm: MikroORM,
  log: (line: string) => void,
  admit: ForeignAdmission,
): Promise<{ registry?: InternalRegistry; reason: string }> {
  if (!settings.enabled) return { reason: "The internal registry is off on this server (SANDBAR_INTERNAL_REGISTRY=off)" };
  const dir = path.join(dataDir, "registry");
  const store = new RegistryCredentialStore(orm);
  try {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const key = await signingKey(dir);
    const tokens = await startTokenService({
      service: REGISTRY_SERVICE,
      issuer: TOKEN_ISSUER,
      keyPem: key.keyPem,
      certDer: key.certDer,
      verify: (u, s) => store.verify(u, s),
      admit,
      namespaceOf,
      listen: "external" in settings ? settings.tokenService : undefined,
      log,
    });
    let proc: RegistryProcess | undefined;
    let host: string;
    if ("external" in settings) {
      host = settings.external;
      // The operator's registry trusts this server's tokens: what its config must say.
      log(`internal registry: pushes go to ${host}; its config needs auth: {token: {realm: "${tokens.realm}", service: ${REGISTRY_SERVICE}, issuer: ${TOKEN_ISSUER}, rootcertbundle: ${key.certPath}}}`);
    } else {
      host = `${settings.host}:${settings.port || (await freePort())}`;
      try {
        proc = await startRegistryProcess({ dir, address: host, realm: tokens.realm, certPath: key.certPath, log });
      } catch (err) {
        await tokens.stop();
        throw err;
      }
      log(`internal registry: serving on ${host} (storage ${path.join(dir, "data")})`);
    }
    const registryId = await transientRow(orm, host);
    const pullAccounts = new Map<string, { credentials: RegistryCredentials; expiresAt: Date }>();
    const buildAccounts = new Map<string, { credentials: RegistryCredentials; expiresAt: Date }>();
    return {
      reason: "",
      registry: {
        host,
        owns: (registry) => registry === host || registry === host.replace(/^127\.0\.0\.1:/, "localhost:"),
        async pushAccess(organizationId) {
          const c = await store.issue(organizationId, "pull,push", PUSH_ACCESS_SECONDS);
          return create(RegistryPushAccessSchema, { username: c.username, secret: c.secret, registryUrl: host, registryId, project: namespaceOf(organizationId), expiresAt: timestampFromDate(c.expiresAt) });
        },
        async pullCredentials(organizationId) {
          // One pull account per organization at a time, reused while it has minutes left.
          const cached = pullAccounts.get(organizationId);
          if (cached && cached.expiresAt.getTime() - Date.now() > PULL_REUSE_MARGIN_MS) return cached.credentials;
          const c = await store.issue(organizationId, "pull", PULL_ACCESS_SECONDS);
          if (pullAccounts.size >= 10_000) pullAccounts.clear();
          const credentials = { username: c.username, password: c.secret };
          pullAccounts.set(organizationId, { credentials, expiresAt: c.expiresAt });
          return credentials;
        },
        async buildCredentials(organizationId) {
          const cached = buildAccounts.get(organizationId);
          if (cached && cached.expiresAt.getTime() - Date.now() > BUILD_REUSE_MARGIN_MS) return cached.credentials;
          const c = await store.issue(organizationId, "pull,push", BUILD_ACCESS_SECONDS);
          if (buildAccounts.size >= 10_000) buildAccounts.clear();
          const credentials = { username: c.username, password: c.secret };
          buildAccounts.set(organizationId, { credentials, expiresAt: c.expiresAt });
          return credentials;
        },
        async stop() {
          await proc?.stop();
          await tokens.stop();
        },
      },
    };
  } catch (err) {
    const reason = `The internal registry is not running: ${err instanceof Error ? err.message : String(err)}`;
    log(`internal registry: ${reason}`);
    return { reason };
  }
}

/** The registry's row (type "transient", no organization): its id is the DTO's registryId. */
async function transientRow(orm: MikroORM, host: string): Promise<string> {
  const exec = execIn(orm.em.fork());
  const url = `http://${host}`;
  const rows = (await exec(
    `update docker_registry set url = ?, updated_at = clock_timestamp() where registry_type = 'transient' and organization_id is null and name = 'sandbar-internal' returning id`,
    [url],
  )) as Array<{ id: string }>;
  if (rows[0]) return rows[0].id;
  // No stored password: its accounts are the short-lived rows of registry_push_credential.
  const made = (await exec(
    `insert into docker_registry (organization_id, name, url, username, password_sealed, registry_type) values (null, 'sandbar-internal', ?, '', '', 'transient') returning id`,
    [url],
  )) as Array<{ id: string }>;
  return made[0]!.id;
}
