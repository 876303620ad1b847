import type { IncomingMessage, ServerResponse } from "node:http";
import pg from "pg";
import type { Credentials } from "../auth/credentials.ts";
import { JwtVerifier } from "../auth/jwt.ts";
import { ADMIN_USER_ID } from "../bootstrap.ts";
import type { Settings } from "../settings.ts";
import { ISSUER_PATH, startIssuer, type BuiltInIssuer } from "./issuer.ts";


/** Sign-in for this server: the built-in issuer, or an external one from the settings. */
export interface Identity {
  /** What GET /config tells clients. */
  oidc: { issuer: string; clientId: string; audience: string };
  /** The built-in issuer, when no external one is configured. */
  issuer?: BuiltInIssuer;
  /** True for requests the built-in issuer serves. */
  owns(url: string): boolean;
  handle(req: IncomingMessage, res: ServerResponse): void;
  stop(): Promise<void>;
}

export async function startIdentity(settings: Settings, databaseUrl: string, credentials: Credentials, log: (line: string) => void): Promise<Identity> {
  if (settings.oidc) {
    credentials.useJwtVerifier(new JwtVerifier({ issuer: settings.oidc.issuer, audience: settings.oidc.audience, reservedSubjects: [ADMIN_USER_ID] }));
    log(`sign-in: external OpenID issuer ${settings.oidc.issuer}`);
    return { oidc: settings.oidc, owns: () => false, handle: () => {}, stop: async () => {} };
  }
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
  pool.on("error", () => {});
  const issuer = await startIssuer({ pool, publicUrl: settings.publicUrl, log, throttle: { store: settings.rateLimits.store, options: settings.loginThrottle } });
  credentials.useJwtVerifier(new JwtVerifier({ issuer: issuer.issuer, audience: issuer.audience, localKeys: issuer.jwks }));
  return {
    oidc: { issuer: issuer.issuer, clientId: issuer.clientId, audience: issuer.audience },
    issuer,
    owns: (url) => url === ISSUER_PATH || url.startsWith(ISSUER_PATH + "/") || url.startsWith(ISSUER_PATH + "?"),
    handle: (req, res) => issuer.handle(req, res),
    async stop() {
      issuer.close();
      await pool.end().catch(() => {});
    },
  };
}
