import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { MikroORM } from "@mikro-orm/postgresql";

/** How long the cookie a token link leaves stays good. */
export const COOKIE_MAX_AGE_S = 3600;

export type CookieVerdict = "ok" | "expired" | "forged";

/**
 * The cookie a preview token link (`?DAYTONA_SANDBOX_AUTH_KEY=`) leaves: `<expiry>.<mac>`, an
 * HMAC-SHA256 under a server key of the sandbox id, the expiry and the sandbox's current preview
 * token. It names no secret, and stops working when the token rotates (every start) or expires.
 * The key is made once and kept in the database, shared by every control process (as the
 * secret box's key is).
 */
export class PreviewCookies {
  readonly #key: Buffer;

  private constructor(key: Buffer) {
    this.#key = key;
  }

  static async open(orm: MikroORM): Promise<PreviewCookies> {
    const conn = orm.em.getConnection();
    await conn.execute(`insert into oidc_secret (name, value) values ('preview-cookie', ?) on conflict (name) do nothing`, [randomBytes(32).toString("base64")]);
    const rows = (await conn.execute(`select value from oidc_secret where name = 'preview-cookie'`)) as Array<{ value: string }>;
    return new PreviewCookies(Buffer.from(rows[0]!.value, "base64"));
  }

  /** The cookie's name for a sandbox (one per sandbox, so several sandboxes on one host do not collide). */
  name(sandboxId: string): string {
    return `sandbar-preview-${sandboxId}`;
  }

  issue(sandboxId: string, authToken: string, now = Date.now()): string {
    const expires = Math.floor(now / 1000) + COOKIE_MAX_AGE_S;
    return `${expires}.${this.#mac(sandboxId, expires, authToken)}`;
  }

  verify(value: string, sandboxId: string, authToken: string, now = Date.now()): CookieVerdict {
    const m = /^([0-9]{1,12})\.([A-Za-z0-9_-]{43})$/.exec(value);
    if (!m) return "forged";
    const expires = Number(m[1]);
    const given = Buffer.from(m[2]!, "base64url");
    const want = Buffer.from(this.#mac(sandboxId, expires, authToken), "base64url");
    if (given.length !== want.length || !timingSafeEqual(given, want)) return "forged";
    return expires * 1000 > now ? "ok" : "expired";
  }

  #mac(sandboxId: string, expires: number, authToken: string): string {
    return createHmac("sha256", this.#key).update(`${sandboxId}\n${expires}\n${authToken}`).digest("base64url");
  }
}

/** The value of one cookie in a Cookie header. */
export function cookieValue(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** The Cookie header without the preview's own cookies (the sandbox's server never sees them). */
export function withoutPreviewCookies(header: string): string | undefined {
  const kept = header.split(";").map((p) => p.trim()).filter((p) => p && !p.startsWith("sandbar-preview-"));
  return kept.length ? kept.join("; ") : undefined;
}
