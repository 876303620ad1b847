import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";

// Short-lived S3 credentials scoped to one organization's prefix, made and checked by the server
// itself (the embedded store has no IAM, and an operator's S3 needs no STS this way). Nothing is
// stored: the session token carries the organization, the access key and the expiry under an
// HMAC, and the secret is an HMAC of key and token. The server key is made once and shared through
// the database by every control process, as the preview cookies' key.

export interface PushCredentials {
  accessKeyId: string;
  secretAccessKey: string;
  sessionToken: string;
  organizationId: string;
  expiresAt: Date;
}

/** One hour, as the reference's STS credentials. */
const PUSH_ACCESS_TTL_MS = 60 * 60 * 1000;

const b64url = (b: Buffer) => b.toString("base64url");

export class PushAccessKeys {
  readonly #key: Buffer;

  private constructor(key: Buffer) {
    this.#key = key;
  }

  static async open(orm: MikroORM): Promise<PushAccessKeys> {
    const conn = orm.em.getConnection();
    await conn.execute(`insert into oidc_secret (name, value) values ('object-storage-push', ?) on conflict (name) do nothing`, [randomBytes(32).toString("base64")]);
    const rows = (await conn.execute(`select value from oidc_secret where name = 'object-storage-push'`)) as Array<{ value: string }>;
    return new PushAccessKeys(Buffer.from(rows[0]!.value, "base64"));
  }

  #mac(...parts: string[]): Buffer {
    return createHmac("sha256", this.#key).update(parts.join("\n")).digest();
  }

  issue(organizationId: string, now = Date.now()): PushCredentials {
    const accessKeyId = "SBR" + randomBytes(10).toString("hex").toUpperCase();
    const expiresAt = new Date(now + PUSH_ACCESS_TTL_MS);
    const payload = b64url(Buffer.from(JSON.stringify({ o: organizationId, k: accessKeyId, e: Math.floor(expiresAt.getTime() / 1000) })));
    const sessionToken = `${payload}.${b64url(this.#mac("token", payload))}`;
    return { accessKeyId, sessionToken, secretAccessKey: b64url(this.#mac("secret", accessKeyId, sessionToken)), organizationId, expiresAt };
  }

  /**
   * The credentials a request presents (its access key and session token), if this server issued
   * them; `expired` when they were but are past their hour.
   */
  resolve(accessKeyId: string, sessionToken: string, now = Date.now()): PushCredentials | "expired" | undefined {
    const [payload, mac, extra] = sessionToken.split(".");
    if (!payload || !mac || extra !== undefined) return undefined;
    const want = this.#mac("token", payload);
    const got = Buffer.from(mac, "base64url");
    if (got.length !== want.length || !timingSafeEqual(got, want)) return undefined;
    let claims: { o?: unknown; k?: unknown; e?: unknown };
    try {
      claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as typeof claims;
    } catch {
      return undefined;
    }
    if (typeof claims.o !== "string" || claims.k !== accessKeyId || typeof claims.e !== "number") return undefined;
    if (claims.e * 1000 <= now) return "expired";
    return { accessKeyId, sessionToken, secretAccessKey: b64url(this.#mac("secret", accessKeyId, sessionToken)), organizationId: claims.o, expiresAt: new Date(claims.e * 1000) };
  }
}
