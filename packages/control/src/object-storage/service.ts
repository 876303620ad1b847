import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { ObjectStorageService } from "@sandbar/protocol/gen/sandbar/control/v1/registry_pb.js";
import { authOf, organizationOf } from "../call/call.ts";
import type { ObjectStorageBackend } from "./backend.ts";
import type { PushAccessKeys } from "./push-credentials.ts";
import { S3_PREFIX } from "./s3-proxy.ts";

// GET /object-storage/push-access: credentials for the organization's prefix, answered in the
// reference's StorageAccessDto shape (the clients give storageUrl to the S3 client as its
// endpoint, path-style). The reference accepts either of two scopes, which the route's single
// scope cannot say: checked here.

const SCOPES = ["write:snapshots", "write:sandboxes"];

export function objectStorageService(backend: ObjectStorageBackend | undefined, keys: PushAccessKeys | undefined, publicUrl: string): Partial<ServiceImpl<typeof ObjectStorageService>> {
  return {
    async getStoragePushAccess(_req, ctx: HandlerContext) {
      const organizationId = organizationOf(ctx);
      const held = authOf(ctx).permissions;
      if (!SCOPES.some((s) => held?.has(s))) throw errors.permissionDenied(`Access denied: needs ${SCOPES.join(" or ")}`);
      if (!backend || !keys) throw errors.unavailable("Object storage is not configured");
      const c = keys.issue(organizationId);
      return { accessKey: c.accessKeyId, secret: c.secretAccessKey, sessionToken: c.sessionToken, storageUrl: `${publicUrl}${S3_PREFIX}`, organizationId, bucket: backend.bucket, region: backend.region };
    },
  };
}
