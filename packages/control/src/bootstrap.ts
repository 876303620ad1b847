import { randomUUID } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { EntityManager, MikroORM } from "@mikro-orm/postgresql";
import { generateApiKey, hashApiKey, keyEnds } from "./auth/key-material.ts";
import { ApiKeyRecord, User } from "./db/entities.ts";
import { execIn } from "./db/exec.ts";
import { insertOrganization } from "./organizations/new-organization.ts";
import { ALL_SCOPES } from "./auth/scopes.ts";
import { generatePassword, hashPassword, verifyPassword } from "./identity/passwords.ts";

export const ADMIN_USER_ID = "sandbar-admin";
const ADMIN_KEY_NAME = "sandbar-admin";
const NOT_PRINTED = "; not printed (SANDBAR_PRINT_SECRETS=true prints it)";

/**
 * First start: a default organization, an admin user owning it and a full-scope API key.
 * The key is SANDBAR_BOOTSTRAP_API_KEY when set (and follows it when it changes later),
 * otherwise generated and written 0600 into the data dir. The log says where, not what: a log
 * is read (and kept) by more people than the data dir. `printSecrets` (SANDBAR_PRINT_SECRETS)
 * also prints a generated value, once.
 */
export async function bootstrap(
  orm: MikroORM,
  dataDir: string,
  presetKey: string | undefined,
  log: (line: string) => void,
  /** The admin's sign-in password for the built-in issuer; `false` when an external issuer is used. */
  password: { preset?: string } | false = false,
  printSecrets = false,
): Promise<void> {
  const keyFile = join(dataDir, "admin-api-key");
  // With an external database nothing else has made the data dir yet.
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  await orm.em.fork().transactional(async (em) => {
    await bootstrapKey(em);
    if (password) await bootstrapPassword(em, password.preset);
  });

  /**
   * The admin signs in as "sandbar-admin" with SANDBAR_BOOTSTRAP_PASSWORD (followed when it
   * changes), or a password generated once and written 0600 beside the key.
   */
  async function bootstrapPassword(em: EntityManager, preset: string | undefined): Promise<void> {
    const run = execIn(em);
    const rows = (await run(`select password_hash from user_password where user_id = ?`, [ADMIN_USER_ID])) as Array<{ password_hash: string }>;
    const current = rows[0]?.password_hash;
    const file = join(dataDir, "admin-password");
    if (current && (!preset || (await verifyPassword(preset, current)))) return;
    const value = preset ?? generatePassword();
    await run(
      `insert into user_password (user_id, password_hash) values (?, ?)
       on conflict (user_id) do update set password_hash = excluded.password_hash, updated_at = now()`,
      [ADMIN_USER_ID, await hashPassword(value)],
    );
    if (preset) {
      log(`admin password (user ${ADMIN_USER_ID}): the value of SANDBAR_BOOTSTRAP_PASSWORD`);
    } else {
      await writeFile(file, value + "\n", { mode: 0o600 });
      if (printSecrets) log(`admin password for user ${ADMIN_USER_ID} (shown once, SANDBAR_PRINT_SECRETS): ${value}`);
      log(`admin password for user ${ADMIN_USER_ID}: generated, in ${file} (mode 0600)${printSecrets ? "" : NOT_PRINTED}`);
    }
  }

  async function bootstrapKey(em: EntityManager): Promise<void> {
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
    em.create(User, { id: ADMIN_USER_ID, name: "Sandbar admin", email: "", role: "admin", createdAt: new Date() });
    await em.flush(); // the user row goes in before the organization that names it
    const exec = execIn(em);
    const orgId = await insertOrganization(exec, { name: "Default", createdBy: ADMIN_USER_ID, personal: false, operator: true });
    // The operator's own organization: its admin key may manage keys.
    await exec(`update organization set managed_api_keys = true where id = ?`, [orgId]);
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
      if (printSecrets) log(`admin API key (shown once, SANDBAR_PRINT_SECRETS): ${value}`);
      log(`admin API key: generated, in ${keyFile} (mode 0600)${printSecrets ? "" : NOT_PRINTED}`);
    }
  }
}

function keyColumns(value: string) {
  const { prefix, suffix } = keyEnds(value);
  return { keyHash: hashApiKey(value), keyPrefix: prefix, keySuffix: suffix };
}

