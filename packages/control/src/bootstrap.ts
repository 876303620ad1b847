import { randomUUID } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { MikroORM } from "@mikro-orm/postgresql";
import { generateApiKey, hashApiKey, keyEnds } from "./auth/key-material.ts";
import { ApiKeyRecord, Organization, OrganizationMember, User } from "./db/entities.ts";
import { ALL_SCOPES } from "./auth/scopes.ts";

export const ADMIN_USER_ID = "sandbar-admin";
const ADMIN_KEY_NAME = "sandbar-admin";

/**
 * First start: a default organization, an admin user owning it and a full-scope API key.
 * The key is SANDBAR_BOOTSTRAP_API_KEY when set (and follows it when it changes later),
 * otherwise generated, written 0600 into the data dir and printed once.
 */
export async function bootstrap(orm: MikroORM, dataDir: string, presetKey: string | undefined, log: (line: string) => void): Promise<void> {
  const keyFile = join(dataDir, "admin-api-key");
  await orm.em.fork().transactional(async (em) => {
    // One bootstrap at a time, even with several control processes starting together.
    await em.getConnection().execute("select pg_advisory_xact_lock(7011)", [], "all", em.getTransactionContext());
    const existing = await em.findOne(ApiKeyRecord, { userId: ADMIN_USER_ID, name: ADMIN_KEY_NAME });
    if (existing) {
      if (presetKey && existing.keyHash !== hashApiKey(presetKey)) {
        Object.assign(existing, keyColumns(presetKey));
        log("admin API key replaced by SANDBAR_BOOTSTRAP_API_KEY");
      } else if (!presetKey) {
        log(`admin API key: in ${keyFile}`);
      }
      return;
    }
    const orgId = randomUUID();
    em.create(User, { id: ADMIN_USER_ID, name: "Sandbar admin", email: "", role: "admin", createdAt: new Date() });
    em.create(Organization, {
      id: orgId, name: "Default", personal: false, createdBy: ADMIN_USER_ID,
      // The operator's own organization: its admin key may manage keys.
      managedApiKeys: true, createdAt: new Date(), updatedAt: new Date(),
    });
    await em.flush(); // rows referenced by the member and key rows below go in first
    em.create(OrganizationMember, { organizationId: orgId, userId: ADMIN_USER_ID, role: "owner", createdAt: new Date() });
    const value = presetKey ?? generateApiKey();
    em.create(ApiKeyRecord, {
      id: randomUUID(), organizationId: orgId, userId: ADMIN_USER_ID, name: ADMIN_KEY_NAME,
      ...keyColumns(value), permissions: [...ALL_SCOPES], createdByKeyHash: null,
      createdAt: new Date(), lastUsedAt: null, expiresAt: null,
    });
    await em.flush();
    if (presetKey) {
      log("admin API key: the value of SANDBAR_BOOTSTRAP_API_KEY");
    } else {
      await writeFile(keyFile, value + "\n", { mode: 0o600 });
      log(`admin API key (shown once): ${value}`);
      log(`  saved to ${keyFile} (mode 0600)`);
    }
  });
}

function keyColumns(value: string) {
  const { prefix, suffix } = keyEnds(value);
  return { keyHash: hashApiKey(value), keyPrefix: prefix, keySuffix: suffix };
}

/** The admin key written at first start, for tools running beside the server. */
export async function readAdminKey(dataDir: string): Promise<string> {
  return (await readFile(join(dataDir, "admin-api-key"), "utf8")).trim();
}
