import { createCipheriv, createDecipheriv, randomBytes, scryptSync } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";

const VERSION = "v1:";

/**
 * Authenticated encryption (AES-256-GCM) of values the server must read back in clear later,
 * such as telemetry headers. The key comes from SANDBAR_ENCRYPTION_KEY, else from a random one
 * made once and shared through the database by every control process.
 */
export class SecretBox {
  readonly #key: Buffer;

  private constructor(key: Buffer) {
    this.#key = key;
  }

  static async open(orm: MikroORM, configured: string | undefined): Promise<SecretBox> {
    if (configured) return new SecretBox(scryptSync(configured, "sandbar-secret-box", 32));
    const conn = orm.em.getConnection();
    await conn.execute(`insert into oidc_secret (name, value) values ('secret-box', ?) on conflict (name) do nothing`, [randomBytes(32).toString("base64")]);
    const rows = (await conn.execute(`select value from oidc_secret where name = 'secret-box'`)) as Array<{ value: string }>;
    return new SecretBox(Buffer.from(rows[0]!.value, "base64"));
  }

  seal(plain: string): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv("aes-256-gcm", this.#key, iv);
    const data = Buffer.concat([cipher.update(plain, "utf8"), cipher.final()]);
    return VERSION + Buffer.concat([iv, cipher.getAuthTag(), data]).toString("base64");
  }

  /** The clear value; throws when the value was not sealed with this key. */
  open(sealed: string): string {
    if (!sealed.startsWith(VERSION)) throw new Error("not a sealed value");
    const raw = Buffer.from(sealed.slice(VERSION.length), "base64");
    const decipher = createDecipheriv("aes-256-gcm", this.#key, raw.subarray(0, 12));
    decipher.setAuthTag(raw.subarray(12, 28));
    return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString("utf8");
  }
}
