import type { ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { PreviewService } from "@sandbar/protocol/gen/sandbar/control/v1/preview_pb.js";
import type { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import type { Credentials } from "../auth/credentials.ts";
import { ORG_HEADERS } from "../auth/guard.ts";
import { callerOf, organizationOf } from "../call/call.ts";
import { isAuthToken, type SandboxManager } from "../sandboxes/manager.ts";
import type { SignedPreviewUrls } from "./signed-urls.ts";
import { SIGNED_TOKEN } from "./address.ts";
import type { PreviewUrls } from "./urls.ts";
import { TOOLBOX_SCOPE } from "../toolbox/mount.ts";

/** What a caller must hold to reach a sandbox's ports or get its preview token: the toolbox's scope. */
const PREVIEW_SCOPE = TOOLBOX_SCOPE;


function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw errors.invalidArgument("Invalid port");
}

/**
 * The proxy's checks as API routes (spec 4.5 preview rows): each answers `true` or a 404 that
 * does not tell a private or foreign sandbox from a missing one.
 */
export function previewService(manager: SandboxManager, credentials: Credentials): Partial<ServiceImpl<typeof PreviewService>> {
  const live = async (id: string) => {
    const row = await manager.store.byId(id);
    if (!row || row.state === "destroyed") throw errors.notFound(`Sandbox with ID ${id} not found`);
    return row;
  };
  return {
    async isSandboxPublic(req) {
      const row = await live(req.sandboxId);
      if (!row.public) throw errors.notFound(`Sandbox with ID ${req.sandboxId} not found`);
      return { ok: true };
    },
    async validateAuthToken(req) {
      const row = await live(req.sandboxId);
      if (!isAuthToken(row.authToken, req.authToken)) throw errors.notFound(`Sandbox with ID ${req.sandboxId} not found`);
      return { ok: true };
    },
    async hasSandboxAccess(req, ctx) {
      const caller = callerOf(ctx);
      const row = await live(req.sandboxId);
      // A key acts in its own organization only; a signed-in person in the organization their
      // header chooses, or without one in any they are a member of.
      const chosen = ORG_HEADERS.map((h) => ctx.requestHeader.get(h)).find(Boolean);
      const inScope = caller.apiKey ? caller.apiKey.organizationId === row.organizationId : !chosen || chosen === row.organizationId;
      // What the member holds now: a key never outlives a permission its creator lost, as on every route.
      const access = inScope ? await credentials.memberAccess(row.organizationId, caller.userId) : null;
      if (!access) throw errors.notFound(`Sandbox with ID ${req.sandboxId} not found`);
      const held = access.role === "owner" || access.permissions.has(PREVIEW_SCOPE);
      // A port (and through the proxy's Bearer check, every port) is a way into the sandbox: the
      // scope that gates the toolbox and the preview token, not mere membership.
      if (!held || (caller.apiKey && !caller.apiKey.permissions.has(PREVIEW_SCOPE))) {
        throw errors.permissionDenied(`Access denied: reaching a sandbox's ports needs the ${PREVIEW_SCOPE} scope`);
      }
      // As the toolbox, which write:sandboxes gates too: closed while the organization is suspended.
      if (access.suspension !== undefined) throw errors.permissionDenied(access.suspension ? `Organization is suspended: ${access.suspension}` : "Organization is suspended");
      return { ok: true };
    },
  };
}

/** The SandboxService's preview URL routes: a port's URL and token, and signed short-lived URLs. */
export function previewUrlMethods(
  manager: SandboxManager,
  urls: PreviewUrls,
  signed: SignedPreviewUrls,
  publicUrl: string,
): Pick<ServiceImpl<typeof SandboxService>, "getPortPreviewUrl" | "getSignedPortPreviewUrl" | "expireSignedPortPreviewUrl"> {
  return {
    async getPortPreviewUrl(req, ctx) {
      checkPort(req.port);
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      manager.touch(row.id);
      // Port 2280 is the agent's: clients (0.27 to 0.111) follow logs and open terminals over a
      // WebSocket on that URL, which the API itself serves on the toolbox prefix.
      const url = req.port === 2280 ? `${publicUrl}/api/toolbox/${row.id}/toolbox` : urls.portUrl(row.id, req.port);
      return { sandboxId: row.id, url, token: row.authToken };
    },
    async getSignedPortPreviewUrl(req, ctx) {
      checkPort(req.port);
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      const token = await signed.create(row.id, req.port, req.expiresInSeconds);
      return { sandboxId: row.id, port: req.port, token, url: urls.portUrl(token, req.port) };
    },
    async expireSignedPortPreviewUrl(req, ctx) {
      checkPort(req.port);
      const row = await manager.get(organizationOf(ctx), req.sandboxId);
      if (SIGNED_TOKEN.test(req.token)) await signed.expire(row.id, req.port, req.token);
      return {};
    },
  };
}
