import { createHmac, timingSafeEqual } from "node:crypto";
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError, errors } from "@sandbar/protocol";
import type { AuthContext } from "../../auth/principal.ts";
import type { Call } from "../../call/call.ts";
import type { CallChain } from "../../call/chain.ts";
import { TOOLBOX_SCOPE } from "../mount.ts";

// Signed file URLs (the 0.218 client's downloadUrl/uploadUrl): `GET …/files/download` and
// `POST …/files/upload-v2` with `?path=&expires=&signature=` and no API key. The signature is
// `v1_` + base64url(HMAC-SHA256(sandbox key, `v1:files:<METHOD>:<path>:<expires>`)); `expires` is
// epoch seconds, 0 for never (the client's ttlSeconds <= 0). The URL opens that one path with that
// one method in that one sandbox until it expires or the key is rotated; it enters the call chain
// through its foreign admission (failed attempts throttled by address, like bad API keys).

/** The sandbox's signing key (sandboxes/signing-keys.ts) and the organization holding it. */
export interface SignedUrlKeys {
  /** The sandbox (not destroyed) and its key; undefined key when it has none yet. */
  holder(sandboxId: string): Promise<{ organizationId: string; key?: string } | undefined>;
}

function fileUrlSignature(key: string, method: string, path: string, expires: string): string {
  return "v1_" + createHmac("sha256", key).update(`v1:files:${method}:${path}:${expires}`).digest("base64url");
}

/** A request carries a signed URL: a signature in its query and no credentials of the usual kind. */
export function isSignedFileRequest(headers: { authorization?: string }, query: URLSearchParams): boolean {
  return !headers.authorization && query.has("signature");
}

/**
 * Admits a signed-URL request for `method` (the toolbox method the route invokes) as the
 * sandbox's organization with the toolbox's scope, once its signature, path and expiry are good.
 */
export async function admitSignedFileRequest(chain: CallChain, call: Call, method: DescMethod, verb: string, query: URLSearchParams, keys: SignedUrlKeys, now = Date.now()): Promise<void> {
  await chain.admitForeignAs(call, method, () => verifySignedFileUrl(keys, call.sandboxId ?? "", verb, query, now));
}

const refused = (why: string) => new ConnectError(`Invalid signed URL: ${why}`, Code.Unauthenticated);

async function verifySignedFileUrl(keys: SignedUrlKeys, sandboxId: string, verb: string, query: URLSearchParams, now: number): Promise<AuthContext> {
  const path = query.get("path");
  const expires = query.get("expires") ?? "";
  const signature = query.get("signature") ?? "";
  if (!path) throw refused("the path parameter is missing");
  if (!/^\d{1,12}$/.test(expires)) throw refused("expires must be epoch seconds (0 for never)");
  const holder = await keys.holder(sandboxId);
  if (!holder) throw errors.notFound(`Sandbox with ID or name ${sandboxId} not found`);
  if (!holder.key) throw refused("the sandbox has no signing key");
  const want = Buffer.from(fileUrlSignature(holder.key, verb, path, expires));
  const got = Buffer.from(signature);
  // Another path, method or expiry than signed, an altered signature, or a key rotated since.
  if (got.length !== want.length || !timingSafeEqual(got, want)) throw refused("the signature does not match this path and method, or the sandbox's signing key was rotated");
  const at = Number(expires);
  if (at !== 0 && at * 1000 < now) throw errors.permissionDenied(`The signed URL expired at ${new Date(at * 1000).toISOString()}`);
  return { organizationId: holder.organizationId, permissions: new Set([TOOLBOX_SCOPE]) };
}
