import { request, type ClientRequest, type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { ConnectError, errors } from "@sandbar/protocol";
import { clientAddress } from "../server/client-address.ts";
import { PREVIEW_TOKEN_HEADERS, PREVIEW_TOKEN_QUERY, type Grant } from "./access.ts";
import { withoutPreviewCookies } from "./cookie.ts";
import { jarCookies, PATH_FORM_CSP, rewriteHead, scopeSetCookie, splitHead, type CookieJar } from "./path-form.ts";
import { dialTunnel, TunnelError } from "./tunnel-dial.ts";
import type { PortEndpoint, Upstreams } from "./upstreams.ts";

// Forwarding of one request to a sandbox port, streamed both ways (pipe: back-pressure, no
// buffering). Hop-by-hop headers are dropped, the proxy's own credentials never reach the
// sandbox, X-Forwarded-* say where the request came from, and a request whose framing is
// ambiguous is refused before a byte is forwarded.

/** Headers of one connection, not of the request (RFC 9110 7.6.1), and the proxy's own. */
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "proxy-authorization", "proxy-authenticate", "host"]);
const OWN = new Set([...PREVIEW_TOKEN_HEADERS, "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-prefix", "forwarded"]);

/** Where the request came in, for X-Forwarded-*. */
export interface Origin {
  proto: "http" | "https";
  /** The path the address took off (path form), for X-Forwarded-Prefix. */
  prefix: string;
  /** The path form's cookie jar (path-form.ts); absent for the host form, whose cookies pass as they are. */
  jar?: CookieJar;
}

/** Refuses what could be read as two requests, or as another request than the one we check. */
export function refuseAmbiguous(req: IncomingMessage): void {
  const te = req.headers["transfer-encoding"];
  if (te !== undefined) {
    if (req.headers["content-length"] !== undefined) throw errors.invalidArgument("A request may not have both Content-Length and Transfer-Encoding");
    const codings = te.split(",").map((c) => c.trim().toLowerCase());
    if (codings[codings.length - 1] !== "chunked") throw errors.invalidArgument("Transfer-Encoding must end with chunked");
  }
  if (req.httpVersionMajor !== 1 && req.httpVersionMajor !== 2) throw errors.invalidArgument("Unsupported HTTP version");
}

/** The request's headers as the sandbox's server gets them. */
export function upstreamHeaders(req: IncomingMessage, port: number, grant: Grant, origin: Origin, keep: ReadonlySet<string> = new Set()): OutgoingHttpHeaders {
  const listed = new Set(
    String(req.headers.connection ?? "")
      .split(",")
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
  const out: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(req.headers as IncomingHttpHeaders)) {
    if (value === undefined || name.startsWith(":")) continue;
    if (!keep.has(name) && (HOP_BY_HOP.has(name) || listed.has(name) || OWN.has(name))) continue;
    if (name === "authorization" && grant.consumedAuthorization) continue;
    if (name === "cookie") {
      const header = Array.isArray(value) ? value.join("; ") : value;
      const kept = origin.jar ? jarCookies(header, origin.jar) : withoutPreviewCookies(header);
      if (kept) out.cookie = kept;
      continue;
    }
    out[name] = value;
  }
  const host = req.headers.host ?? (req.headers as Record<string, string | undefined>)[":authority"];
  out.host = `127.0.0.1:${port}`;
  out["x-forwarded-for"] = clientAddress(req);
  out["x-forwarded-proto"] = origin.proto;
  if (host) out["x-forwarded-host"] = host;
  if (origin.prefix) out["x-forwarded-prefix"] = origin.prefix;
  return out;
}

/** The path without the token link's parameter (the token goes no further than the proxy). */
export function withoutTokenParameter(path: string): string {
  const q = path.indexOf("?");
  if (q < 0 || !path.includes(PREVIEW_TOKEN_QUERY)) return path;
  const kept = path
    .slice(q + 1)
    .split("&")
    .filter((pair) => pair.split("=")[0] !== PREVIEW_TOKEN_QUERY);
  return path.slice(0, q) + (kept.length ? "?" + kept.join("&") : "");
}

/** Why a port could not be reached, as the client's error: 502 with the agent's reason, 503 for a sandbox whose agent is gone. */
function unreachable(err: unknown, e: PortEndpoint): ConnectError {
  if (err instanceof TunnelError) {
    if (err.reason === "refused") return badGateway(`Nothing listens on port ${e.port} in sandbox ${e.sandboxId}`);
    if (err.reason === "agent") return errors.unavailable(`Sandbox ${e.sandboxId} cannot be reached: ${err.message}`);
    return badGateway(`Port ${e.port} of sandbox ${e.sandboxId} cannot be reached: ${err.message}`);
  }
  const code = (err as NodeJS.ErrnoException).code;
  return badGateway(`Port ${e.port} of sandbox ${e.sandboxId} closed the connection${code ? ` (${code})` : ""}`);
}

function badGateway(message: string): ConnectError {
  return new ConnectError(message, errors.unavailable("").code, { "x-sandbar-http-status": "502" });
}

const RESPONSE_DROP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "trailer", "proxy-authenticate"]);

/**
 * Forwards an HTTP request over a keep-alive tunnel to the port and streams the answer back.
 * Resolves when the exchange is over; rejects (before any response byte) when the port cannot be
 * reached, so the caller answers with the error.
 */
export function forwardHttp(req: IncomingMessage, res: ServerResponse, e: PortEndpoint, upstreams: Upstreams, path: string, headers: OutgoingHttpHeaders, extra: { setCookie?: string; jar?: CookieJar }, retry = true): Promise<void> {
  return new Promise((resolve, reject) => {
    // A chunked body is forwarded chunked whatever the method (Node would send a GET's body unframed).
    if (req.headers["transfer-encoding"] !== undefined) headers["transfer-encoding"] = "chunked";
    let up: ClientRequest;
    try {
      up = request({ method: req.method, path, headers, agent: upstreams.agentFor(e), setHost: false });
    } catch (err) {
      // What node's server took but its client will not send (a header it finds invalid).
      return reject(errors.invalidArgument(`The request cannot be forwarded: ${(err as Error).message}`));
    }
    let responded = false;
    up.on("response", (upRes) => {
      responded = true;
      const out: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(upRes.headers)) if (value !== undefined && !RESPONSE_DROP.has(name)) out[name] = value;
      if (extra.jar) {
        const jar = extra.jar;
        if (out["set-cookie"]) out["set-cookie"] = toList(out["set-cookie"]).map((c) => scopeSetCookie(c, jar, path));
        out["content-security-policy"] = [...toList(out["content-security-policy"]), PATH_FORM_CSP];
      }
      if (extra.setCookie) out["set-cookie"] = [...toList(out["set-cookie"]), extra.setCookie];
      res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, out);
      upRes.pipe(res);
      upRes.once("error", () => res.destroy());
      upRes.once("end", () => resolve());
      res.once("close", () => {
        if (!upRes.complete) upRes.destroy();
        resolve();
      });
    });
    up.on("error", (err) => {
      // The client went away (or the answer had begun): nothing left to tell anyone.
      if (responded || res.headersSent || res.destroyed) {
        res.destroy();
        return resolve();
      }
      // An idle keep-alive tunnel the server had closed: a bodiless request is sent again once.
      if (retry && up.reusedSocket && (req.method === "GET" || req.method === "HEAD") && !req.headers["content-length"] && !req.headers["transfer-encoding"]) {
        return forwardHttp(req, res, e, upstreams, path, headers, extra, false).then(resolve, reject);
      }
      reject(unreachable(err, e));
    });
    res.once("close", () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  });
}

function toList(v: string | string[] | undefined): string[] {
  return v === undefined ? [] : Array.isArray(v) ? v : [v];
}

/**
 * Forwards a WebSocket (any HTTP/1.1 upgrade) request: a tunnel of its own, the request head
 * written as received (less the proxy's credentials), then raw bytes both ways; the server's
 * answer (101 or a refusal) reaches the client as it was sent, but on the path form (`jar`) with
 * its head rewritten as an HTTP answer's would be (a 101 may set cookies too). `onTraffic` is
 * called on bytes either way (activity).
 */
export async function forwardUpgrade(req: IncomingMessage, client: Duplex, head: Buffer, e: PortEndpoint, path: string, headers: OutgoingHttpHeaders, onTraffic: () => void, jar?: CookieJar): Promise<void> {
  let upstream;
  try {
    upstream = await dialTunnel(e.agent, e.port);
  } catch (err) {
    throw unreachable(err, e);
  }
  if (client.destroyed) return void upstream.destroy();
  let text = `${req.method} ${path} HTTP/1.1\r\n`;
  for (const [name, value] of Object.entries(headers)) for (const v of toList(value as string | string[])) text += `${name}: ${v}\r\n`;
  upstream.write(text + "\r\n");
  if (head.length) upstream.write(head);
  const kill = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on("error", kill);
  upstream.on("error", kill);
  client.once("close", () => upstream.destroy());
  upstream.once("close", () => client.end());
  client.on("data", onTraffic);
  upstream.on("data", onTraffic);
  client.pipe(upstream);
  if (!jar) {
    upstream.pipe(client);
    upstream.resume();
    return;
  }
  let buffered: Buffer = Buffer.alloc(0);
  const takeHead = (chunk: Buffer) => {
    buffered = buffered.length ? Buffer.concat([buffered, chunk]) : chunk;
    let split;
    try {
      split = splitHead(buffered);
    } catch {
      return kill();
    }
    if (!split) return;
    upstream.off("data", takeHead);
    upstream.pause();
    client.write(rewriteHead(split.head, jar, path), "latin1");
    if (split.rest.length) client.write(split.rest);
    upstream.pipe(client);
  };
  upstream.on("data", takeHead);
  upstream.resume();
}
