import { request as httpRequest, type IncomingMessage, type ServerResponse } from "node:http";
import { request as httpsRequest } from "node:https";
import { Code, ConnectError } from "@sandbar/protocol";
import type { ForeignAdmission } from "../call/chain.ts";
import type { ObjectStorageBackend } from "./backend.ts";
import type { PushAccessKeys } from "./push-credentials.ts";
import { amzDate, parseAuthorization, signFor, verifySignature, type SignableRequest } from "./sigv4.ts";

// The S3 endpoint clients get from push-access (`<public URL>/s3`, path-style), an adapter of the
// call chain: every request's signature (SigV4, under credentials this server issued) is checked
// through the chain's foreign admission (failed attempts throttled by address), then here the bucket, the
// organization's prefix, and only what a context upload or read needs: list, put, multipart
// upload, get, head), then re-signed with the store's own credentials and streamed to it (the
// embedded s3rver on loopback, or the operator's S3). The body is never buffered.

export const S3_PREFIX = "/s3";
const MAX_SKEW_MS = 15 * 60 * 1000;

const LIST_PARAMS = new Set(["list-type", "prefix", "max-keys", "delimiter", "continuation-token", "start-after", "encoding-type", "fetch-owner", "marker", "x-id"]);
/** Object operations allowed: method -> the query parameter sets each may carry (besides x-id). */
const OBJECT_OPS: Record<string, string[][]> = {
  GET: [[], ["partNumber"]],
  HEAD: [[], ["partNumber"]],
  PUT: [[], ["partNumber", "uploadId"]],
  POST: [["uploads"], ["uploadId"]],
  DELETE: [["uploadId"]],
};
// Not forwarded: the caller's credentials and hop-by-hop headers; the signer adds its own.
const DROP = new Set(["host", "authorization", "x-amz-security-token", "x-amz-date", "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade", "expect"]);

function s3Error(res: ServerResponse, status: number, code: string, message: string): void {
  if (res.headersSent) return void res.destroy();
  const esc = (s: string) => s.replace(/[<>&"']/g, (c) => `&#${c.charCodeAt(0)};`);
  res.writeHead(status, { "content-type": "application/xml" });
  res.end(`<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${esc(message)}</Message></Error>`);
}

function parseQuery(raw: string): Record<string, string | string[]> | undefined {
  const out: Record<string, string | string[]> = {};
  if (raw === "") return out;
  for (const part of raw.split("&")) {
    if (part === "") continue;
    const i = part.indexOf("=");
    let k: string;
    let v: string;
    try {
      k = decodeURIComponent(i < 0 ? part : part.slice(0, i));
      v = i < 0 ? "" : decodeURIComponent(part.slice(i + 1));
    } catch {
      return undefined;
    }
    const prev = out[k];
    out[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v];
  }
  return out;
}

function headersOf(req: IncomingMessage): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(req.headers)) if (v !== undefined) out[k] = Array.isArray(v) ? v.join(",") : v;
  return out;
}

/** A key inside the organization's prefix: `<org>/` then segments that are neither empty, `.` nor `..`. */
function inPrefix(key: string, organizationId: string): boolean {
  if (!key.startsWith(`${organizationId}/`) || key.includes("\0") || key.includes("\\")) return false;
  const rest = key.slice(organizationId.length + 1).split("/");
  return rest.every((seg, i) => (seg === "" ? i === rest.length - 1 && i > 0 : seg !== "." && seg !== ".."));
}

/** Why the operation is refused, or undefined when the organization may do it. */
function refusal(method: string, key: string | undefined, query: Record<string, string | string[]>, headers: Record<string, string>, organizationId: string): string | undefined {
  const params = Object.keys(query).filter((k) => k !== "x-id");
  if (key === undefined) {
    if (method !== "GET" || !params.every((p) => LIST_PARAMS.has(p))) return "Only listing objects is allowed on the bucket";
    const prefix = query.prefix;
    if (typeof prefix !== "string" || !(prefix === organizationId || prefix.startsWith(`${organizationId}/`))) return `Listing is allowed only under the prefix ${organizationId}/`;
    return undefined;
  }
  if (!inPrefix(key, organizationId)) return `Access is allowed only to keys under ${organizationId}/`;
  if (headers["x-amz-copy-source"] !== undefined) return "Copying objects is not allowed";
  const allowed = OBJECT_OPS[method];
  const sorted = [...params].sort().join(",");
  if (!allowed?.some((set) => [...set].sort().join(",") === sorted)) return `${method} with ${params.join(", ") || "no parameters"} is not allowed`;
  return undefined;
}

export interface S3Proxy {
  /** Whether the request is for the S3 endpoint. */
  owns(url: string): boolean;
  handle(req: IncomingMessage, res: ServerResponse): Promise<void>;
}

/** An S3 error answer as a ConnectError: its S3 code and status ride in its metadata. */
function s3Refusal(status: number, code: string, message: string): ConnectError {
  return new ConnectError(message, Code.Unauthenticated, { [S3_CODE]: code, [S3_STATUS]: String(status) });
}
const S3_CODE = "x-s3-error-code";
const S3_STATUS = "x-s3-status";

/** Answers a refused admission the S3 way (a client blocked for failed attempts gets 503 SlowDown, which S3 clients back off from). */
function sendRefusal(res: ServerResponse, err: unknown): void {
  const e = ConnectError.from(err);
  const code = e.metadata.get(S3_CODE);
  if (code) return s3Error(res, Number(e.metadata.get(S3_STATUS)), code, e.rawMessage);
  if (e.code === Code.ResourceExhausted) return s3Error(res, 503, "SlowDown", e.rawMessage);
  s3Error(res, 500, "InternalError", `the S3 endpoint failed: ${e.rawMessage}`);
}

export function s3Proxy(backend: ObjectStorageBackend, keys: PushAccessKeys, admit: ForeignAdmission): S3Proxy {
  const target = new URL(backend.endpoint);
  const basePath = target.pathname.replace(/\/+$/, "");

  return {
    owns: (url) => url === S3_PREFIX || url.startsWith(`${S3_PREFIX}/`) || url.startsWith(`${S3_PREFIX}?`),

    async handle(req, res) {
      try {
        await serve(req, res);
      } catch (err) {
        s3Error(res, 500, "InternalError", `the S3 endpoint failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    },
  };

  /** The request's signature, under credentials this server issued: the organization they belong to. */
  async function verify(signable: SignableRequest): Promise<{ organizationId: string }> {
    const headers = signable.headers;
    const auth = parseAuthorization(headers.authorization ?? "");
    if (!auth) throw s3Refusal(403, "AccessDenied", "Requests must be signed with AWS Signature Version 4 (the credentials of GET /api/object-storage/push-access)");
    const token = headers["x-amz-security-token"];
    const creds = token ? keys.resolve(auth.accessKeyId, token) : undefined;
    if (creds === "expired") throw s3Refusal(400, "ExpiredToken", "The provided token has expired: get new credentials from GET /api/object-storage/push-access");
    if (!creds) throw s3Refusal(403, "InvalidAccessKeyId", "The access key and session token were not issued by this server");
    const date = amzDate(headers["x-amz-date"]);
    if (!date || Math.abs(date.getTime() - Date.now()) > MAX_SKEW_MS) throw s3Refusal(403, "RequestTimeTooSkewed", "x-amz-date is missing or more than 15 minutes from the server's time");
    if (!(await verifySignature(signable, auth, creds.secretAccessKey, date).catch(() => false))) {
      throw s3Refusal(403, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided");
    }
    return { organizationId: creds.organizationId };
  }

  async function serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q < 0 ? url : url.slice(0, q);
    const query = parseQuery(q < 0 ? "" : url.slice(q + 1));
    if (!query) return s3Error(res, 400, "InvalidArgument", "Malformed query string");
    const headers = headersOf(req);
    const method = (req.method ?? "GET").toUpperCase();

    const signable: SignableRequest = { method, protocol: "http:", hostname: "", path, query, headers };
    let organizationId: string;
    try {
      organizationId = (await admit(req, () => verify(signable))).organizationId ?? "";
    } catch (err) {
      return sendRefusal(res, err);
    }

    // /s3/<bucket>[/<key>]: path-style only.
    const rest = path.slice(S3_PREFIX.length);
    const m = /^\/([^/]+)(\/.*)?$/.exec(rest);
    if (!m) return s3Error(res, 403, "AccessDenied", "Only the bucket of push-access is served");
    let bucket: string;
    let key: string | undefined;
    try {
      bucket = decodeURIComponent(m[1]!);
      key = m[2] === undefined || m[2] === "/" ? undefined : decodeURIComponent(m[2].slice(1));
    } catch {
      return s3Error(res, 400, "InvalidURI", "Malformed path");
    }
    if (bucket !== backend.bucket) return s3Error(res, 403, "AccessDenied", `Only the bucket ${backend.bucket} is served`);
    const why = refusal(method, key, query, headers, organizationId);
    if (why) return s3Error(res, 403, "AccessDenied", why);

    const forward: Record<string, string> = {};
    for (const [k, v] of Object.entries(headers)) if (!DROP.has(k)) forward[k] = v;
    forward.host = target.host;
    const outPath = `${basePath}/${m[1]}${m[2] ?? ""}`;
    const signed = await signFor({ method, protocol: target.protocol, hostname: target.hostname, port: target.port ? Number(target.port) : undefined, path: outPath, query, headers: forward }, backend.region, backend.credentials);
    const send = target.protocol === "https:" ? httpsRequest : httpRequest;
    const upstream = send({ method, hostname: target.hostname, port: target.port || undefined, path: outPath + (q < 0 ? "" : url.slice(q)), headers: signed });
    upstream.on("response", (up) => {
      res.writeHead(up.statusCode ?? 502, up.headers);
      up.pipe(res);
      up.on("error", () => res.destroy());
    });
    upstream.on("error", (err) => s3Error(res, 502, "ServiceUnavailable", `object storage unreachable: ${err.message}`));
    req.on("aborted", () => upstream.destroy());
    req.pipe(upstream);
  }
}
