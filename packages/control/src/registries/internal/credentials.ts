import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";
import { errors } from "@sandbar/protocol";
import { dateOf, execIn } from "../../db/exec.ts";

// Short-lived accounts of the internal registry, one row each (migration 0017): what
// registry-push-access hands out (pull and push, 1 h) and what snapshot pulls present (pull only,
// minutes). The token service checks them; the secret itself is never stored.

export type RegistryActions = "pull" | "pull,push";

export interface IssuedCredential {
  username: string;
  /** Shown once; only its SHA-256 is kept. */
  secret: string;
  expiresAt: Date;
}

export interface CredentialGrant {
  organizationId: string;
  actions: RegistryActions;
  expiresAt: Date;
}

const USERNAME = /^robot\$[0-9a-f]{24}$/;
/** Unexpired accounts of one kind per organization. */
export const MAX_LIVE_ACCOUNTS = 100;
const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");

export class RegistryCredentialStore {
  readonly #orm: MikroORM;

  constructor(orm: MikroORM) {
    this.#orm = orm;
  }

  /**
   * A new account for the organization's namespace, valid `ttlSeconds`; sweeps expired ones.
   * At most `max` unexpired accounts of that kind per organization (429 past it), so a loop of
   * calls cannot grow the table without bound.
   */
  async issue(organizationId: string, actions: RegistryActions, ttlSeconds: number, max = MAX_LIVE_ACCOUNTS): Promise<IssuedCredential> {
    // Harbor's robot-account spelling, which the reference's clients have seen.
    const username = `robot$${randomBytes(12).toString("hex")}`;
    const secret = randomBytes(32).toString("base64url");
    return this.#orm.em.fork().transactional(async (tx) => {
      const exec = execIn(tx);
      await exec(`delete from registry_push_credential where expires_at < clock_timestamp() - interval '1 minute'`, []);
      // Serializes the organization's issues, so the count below holds.
      await exec(`select 1 from organization where id = ? for update`, [organizationId]);
      const [{ n }] = (await exec(`select count(*)::int as n from registry_push_credential where organization_id = ? and actions = ? and expires_at > clock_timestamp()`, [organizationId, actions])) as Array<{ n: number }>;
      if (n >= max) throw errors.resourceExhausted(`The organization has ${n} unexpired registry accounts, the most allowed: they expire an hour after they are issued`);
      const rows = (await exec(
        `insert into registry_push_credential (organization_id, username, secret_hash, actions, expires_at)
         values (?, ?, ?, ?, clock_timestamp() + make_interval(secs => ?)) returning expires_at`,
        [organizationId, username, sha256(secret), actions, ttlSeconds],
      )) as Array<{ expires_at: Date | string }>;
      return { username, secret, expiresAt: dateOf(rows[0]!.expires_at) };
    });
  }

  /** What an unexpired account may do; undefined for a wrong, unknown or expired one. */
  async verify(username: string, secret: string): Promise<CredentialGrant | undefined> {
    if (!USERNAME.test(username)) return undefined;
    const rows = (await execIn(this.#orm.em.fork())(
      `select organization_id, secret_hash, actions, expires_at from registry_push_credential
        where username = ? and expires_at > clock_timestamp()`,
      [username],
    )) as Array<{ organization_id: string; secret_hash: string; actions: RegistryActions; expires_at: Date | string }>;
    const row = rows[0];
    if (!row) return undefined;
    const given = Buffer.from(sha256(secret));
    if (!timingSafeEqual(given, Buffer.from(row.secret_hash))) return undefined;
    return { organizationId: row.organization_id, actions: row.actions, expiresAt: dateOf(row.expires_at) };
  }
}
