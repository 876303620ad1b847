import { createHash } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { MikroORM } from "@mikro-orm/postgresql";
import { PreviewService } from "@sandbar/protocol/gen/sandbar/control/v1/preview_pb.js";
import type { Credentials } from "../auth/credentials.ts";
import { ORG_HEADERS } from "../auth/guard.ts";
import { contextFor, newCall } from "../call/call.ts";
import type { CallChain } from "../call/chain.ts";
import { refuse, sendError } from "../gateway/error-answer.ts";
import type { HandwrittenRoute, UpgradeCall, UpgradeRoute } from "../gateway/rest-route.ts";
import type { SandboxManager } from "../sandboxes/manager.ts";
import type { Settings } from "../settings.ts";
import { authorize, type AccessCheck } from "./access.ts";
import { hostAddress, hostLabel, PATH_PREFIX, pathAddress, type PreviewAddress } from "./address.ts";
import { PreviewCookies } from "./cookie.ts";
import { LOOKUP_TTL_MS, PreviewLookup } from "./lookup.ts";
import { cookieJar } from "./path-form.ts";
import { forwardHttp, forwardUpgrade, refuseAmbiguous, upstreamHeaders, withoutTokenParameter, type Origin } from "./proxy.ts";
import { previewService, previewUrlMethods } from "./service.ts";
import { SignedPreviewUrls } from "./signed-urls.ts";
import { Upstreams } from "./upstreams.ts";
import { PreviewUrls } from "./urls.ts";

export interface Preview {
  /** PreviewService's implementation. */
  service: ReturnType<typeof previewService>;
  /** The SandboxService methods for preview URLs. */
  sandboxMethods: ReturnType<typeof previewUrlMethods>;
  /** The path form, as entries of the gateway's route table (every verb, and WebSockets). */
  routes: { handwritten: HandwrittenRoute[]; upgrades: UpgradeRoute[] };
  /** Whether a request is for the host form (`{port}-{id}.{preview domain}`): then it is served here, before the /api split. */
  ownsHost(req: { headers: IncomingMessage["headers"] }): boolean;
  serveHost(req: IncomingMessage, res: ServerResponse): void;
  /** Takes a host-form upgrade; false for any other host. */
  upgradeHost(req: IncomingMessage, socket: Duplex, head: Buffer): boolean;
  close(): void;
}

export interface PreviewDeps {
  orm: MikroORM;
  settings: Settings;
  manager: SandboxManager;
  credentials: Credentials;
  /** The call chain: the Bearer check is a call of PreviewService.HasSandboxAccess through it. */
  chain: CallChain;
  basePath: string;
}

/** How often an open WebSocket counts as activity. */
const WS_ACTIVITY_MS = 30_000;

/** The verbs the path form forwards (HEAD is served by the GET route). */
const VERBS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/**
 * The preview proxy: HTTP and WebSocket traffic to a sandbox port through the control port, by
 * host (`{port}-{sandboxId}.{preview domain}`) or by path (`/api/preview-proxy/{id}/{port}/...`),
 * authorized per access.ts and carried by the sandbox agent's byte tunnel.
 */
export async function startPreview(deps: PreviewDeps): Promise<Preview> {
  const { settings, manager, basePath } = deps;
  const urls = new PreviewUrls(settings);
  const signed = new SignedPreviewUrls(deps.orm);
  const lookup = new PreviewLookup(manager, signed);
  const upstreams = new Upstreams();
  const hasAccess = PreviewService.method.hasSandboxAccess;
  const granted = new Map<string, number>();
  const check: AccessCheck = {
    cookies: await PreviewCookies.open(deps.orm),
    secure: urls.secure,
    // A call of PreviewService.HasSandboxAccess through the chain: authentication, then the
    // membership check. A grant is remembered as long as the proxy's other reads (by a digest of the
    // credential and organization header, never the credential itself).
    async checkBearer(req, sandboxId) {
      const key = createHash("sha256").update(`${req.headers.authorization}\n${ORG_HEADERS.map((h) => req.headers[h] ?? "").join("\n")}\n${sandboxId}`).digest("base64");
      const now = Date.now();
      if ((granted.get(key) ?? 0) > now) return;
      await deps.chain.unary(contextFor(newCall(req), hasAccess, new AbortController().signal), { sandboxId });
      if (granted.size >= 10_000) granted.clear();
      granted.set(key, now + LOOKUP_TTL_MS);
    },
  };
  const origin = (address: PreviewAddress): Origin => ({ proto: urls.secure ? "https" : "http", prefix: address.prefix, ...(address.prefix ? { jar: cookieJar(address) } : {}) });

  /** Who the request is for and whether it may go there: the sandbox, where its port is, what to forward. */
  async function admit(req: IncomingMessage, address: PreviewAddress) {
    refuseAmbiguous(req);
    const sandboxId = address.signed ? await lookup.signedSandbox(address.id, address.port) : address.id;
    const sandbox = await lookup.sandbox(sandboxId);
    const q = address.path.indexOf("?");
    const grant = await authorize(check, req, new URLSearchParams(q < 0 ? "" : address.path.slice(q + 1)), address, sandbox);
    const endpoint = await lookup.endpoint(sandbox, address.port);
    manager.touch(sandbox.id);
    return { endpoint, grant, path: withoutTokenParameter(address.path) };
  }

  async function serve(req: IncomingMessage, res: ServerResponse, address: PreviewAddress): Promise<void> {
    const { endpoint, grant, path } = await admit(req, address);
    const at = origin(address);
    const headers = upstreamHeaders(req, address.port, grant, at);
    try {
      await forwardHttp(req, res, endpoint, upstreams, path, headers, { setCookie: grant.setCookie, jar: at.jar });
    } catch (err) {
      lookup.forget(endpoint.sandboxId);
      throw err;
    }
  }

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer, address: PreviewAddress): Promise<void> {
    const { endpoint, grant, path } = await admit(req, address);
    const at = origin(address);
    const headers = { ...upstreamHeaders(req, address.port, grant, at, new Set(["upgrade"])), connection: "Upgrade" };
    const touch = () => manager.touch(endpoint.sandboxId);
    await forwardUpgrade(req, socket, head, endpoint, path, headers, touch, at.jar);
    // An open connection is activity even while quiet (the reference stamps every 50 s).
    const timer = setInterval(touch, WS_ACTIVITY_MS);
    socket.once("close", () => clearInterval(timer));
  }

  const pathRoute = `${PATH_PREFIX}/{sandbox_id}/{port}/{path=**}`;
  const routes = {
    handwritten: VERBS.map(
      (verb): HandwrittenRoute => ({
        verb,
        template: pathRoute,
        // Named after the public check it stands for; the proxy authorizes each request itself, and
        // a web app's traffic is not counted against the API's anonymous rate limit.
        method: PreviewService.method.isSandboxPublic,
        selfAuthorized: true,
        serve: ({ req, res }) => serve(req, res, pathAddress(req.url ?? "/", basePath)),
      }),
    ),
    upgrades: [{ template: pathRoute, accept: ({ req, socket, head }: UpgradeCall) => upgrade(req, socket, head, pathAddress(req.url ?? "/", basePath)) }],
  };

  const labelOf = (req: { headers: IncomingMessage["headers"] }) => hostLabel(req.headers.host ?? (req.headers[":authority"] as string | undefined), urls.domain);

  return {
    service: previewService(manager, deps.credentials),
    sandboxMethods: previewUrlMethods(manager, urls, signed, settings.publicUrl),
    routes,
    ownsHost: (req) => labelOf(req) !== undefined,
    serveHost(req, res) {
      const url = req.url ?? "/";
      (async () => serve(req, res, hostAddress(labelOf(req)!, url)))().catch((err: unknown) => sendError(res, url, err));
    },
    upgradeHost(req, socket, head) {
      const label = labelOf(req);
      if (label === undefined) return false;
      socket.on("error", () => socket.destroy());
      (async () => upgrade(req, socket, head, hostAddress(label, req.url ?? "/")))().catch((err: unknown) => refuse(socket, req.url ?? "/", err));
      return true;
    },
    close: () => upstreams.close(),
  };
}
