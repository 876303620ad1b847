import { createHash, createHmac, timingSafeEqual, type Hash, type Hmac } from "node:crypto";
import { SignatureV4 } from "@smithy/signature-v4";

// AWS Signature Version 4 for S3 (header form), checked and made with the AWS SDK's own signer
// (@smithy/signature-v4), so the canonical request is built exactly as the clients build it. The
// payload hash is the request's x-amz-content-sha256 header as signed (the body is streamed on,
// never buffered here).

class NodeSha256 {
  readonly #h: Hash | Hmac;
  constructor(secret?: string | ArrayBuffer | ArrayBufferView) {
    this.#h = secret === undefined ? createHash("sha256") : createHmac("sha256", typeof secret === "string" ? secret : Buffer.from(ArrayBuffer.isView(secret) ? secret.buffer.slice(secret.byteOffset, secret.byteOffset + secret.byteLength) : secret));
  }
  update(data: string | ArrayBuffer | ArrayBufferView): void {
    this.#h.update(typeof data === "string" ? data : ArrayBuffer.isView(data) ? Buffer.from(data.buffer, data.byteOffset, data.byteLength) : Buffer.from(data));
  }
  async digest(): Promise<Uint8Array> {
    return new Uint8Array(this.#h.digest());
  }
  reset(): void {}
}

export interface SignableRequest {
  method: string;
  protocol: string;
  hostname: string;
  port?: number;
  /** As sent: already URI-encoded, without the query. */
  path: string;
  query: Record<string, string | string[]>;
  headers: Record<string, string>;
}

export interface ParsedAuthorization {
  accessKeyId: string;
  date: string;
  region: string;
  service: string;
  signedHeaders: string[];
  signature: string;
}

const AUTH = /^AWS4-HMAC-SHA256 Credential=([^/,\s]+)\/(\d{8})\/([^/,\s]+)\/([^/,\s]+)\/aws4_request,\s*SignedHeaders=([a-z0-9;_.-]+),\s*Signature=([0-9a-f]{64})$/;

export function parseAuthorization(header: string): ParsedAuthorization | undefined {
  const m = AUTH.exec(header.trim());
  if (!m) return undefined;
  return { accessKeyId: m[1]!, date: m[2]!, region: m[3]!, service: m[4]!, signedHeaders: m[5]!.split(";"), signature: m[6]! };
}

/** `x-amz-date` (20240102T030405Z) as a Date, or undefined. */
export function amzDate(value: string | undefined): Date | undefined {
  const m = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(value ?? "");
  if (!m) return undefined;
  return new Date(Date.UTC(+m[1]!, +m[2]! - 1, +m[3]!, +m[4]!, +m[5]!, +m[6]!));
}

function signer(region: string, accessKeyId: string, secretAccessKey: string, sessionToken?: string): SignatureV4 {
  return new SignatureV4({ service: "s3", region, credentials: { accessKeyId, secretAccessKey, sessionToken }, sha256: NodeSha256, uriEscapePath: false, applyChecksum: true });
}

/** Whether `auth` is the signature of `req` (only its signed headers) under `secretAccessKey`. */
export async function verifySignature(req: SignableRequest, auth: ParsedAuthorization, secretAccessKey: string, signingDate: Date): Promise<boolean> {
  const headers: Record<string, string> = {};
  for (const name of auth.signedHeaders) {
    const v = req.headers[name];
    if (v === undefined) return false;
    headers[name] = v;
  }
  const token = headers["x-amz-security-token"];
  const signed = await signer(auth.region, auth.accessKeyId, secretAccessKey, token).sign({ ...req, headers }, { signingDate, signableHeaders: new Set(auth.signedHeaders) });
  const got = parseAuthorization(String(signed.headers.authorization ?? ""));
  if (!got) return false;
  return timingSafeEqual(Buffer.from(got.signature), Buffer.from(auth.signature)) && got.signedHeaders.join(";") === auth.signedHeaders.join(";");
}

/** Signs `req` for the store behind the endpoint; answers the headers to send. */
export async function signFor(req: SignableRequest, region: string, credentials: { accessKeyId: string; secretAccessKey: string }): Promise<Record<string, string>> {
  const signed = await signer(region, credentials.accessKeyId, credentials.secretAccessKey).sign(req, { signingDate: new Date() });
  return signed.headers as Record<string, string>;
}
