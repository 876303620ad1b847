import type { ServiceImpl } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ConfigService, RateLimitConfigSchema } from "@sandbar/protocol/gen/sandbar/control/v1/config_pb.js";
import type { Settings } from "../settings.ts";

/** GET /config: what clients need to know about this server; no credentials. */
export function configService(
  settings: Settings,
  oidc: { issuer: string; clientId: string; audience: string },
  rateLimit: MessageInitShape<typeof RateLimitConfigSchema>,
): Partial<ServiceImpl<typeof ConfigService>> {
  const { publicUrl, version } = settings;
  const host = new URL(publicUrl).host;
  return {
    getConfig() {
      return {
        version,
        // The issuer clients sign in with (built-in or external), as the reference's clients read it.
        oidc: { issuer: oidc.issuer, clientId: oidc.clientId, audience: oidc.audience },
        linkedAccountsEnabled: false,
        announcements: {},
        proxyTemplateUrl: `http://{{PORT}}-{{sandboxId}}.preview.${host}`,
        proxyToolboxUrl: `${publicUrl}/api/toolbox-proxy`,
        defaultSnapshot: "sandbar-default",
        dashboardUrl: `${publicUrl}/dashboard`,
        maxAutoArchiveInterval: 43200,
        maintananceMode: false,
        environment: process.env.NODE_ENV || "production",
        // The server's limits (an organization's own are on the organization).
        rateLimit,
      };
    },
  };
}
