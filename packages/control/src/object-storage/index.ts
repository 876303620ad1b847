// Object storage for build contexts: the store (embedded s3rver or the operator's S3), the
// server's S3 endpoint with per-organization credentials, push-access, and reading contexts.
import type { MikroORM } from "@mikro-orm/postgresql";
import { startObjectStorage, type ObjectStorageBackend } from "./backend.ts";
import { BuildContexts } from "./contexts.ts";
import { PushAccessKeys } from "./push-credentials.ts";
import type { ForeignAdmission } from "../call/chain.ts";
import { s3Proxy, type S3Proxy } from "./s3-proxy.ts";
import { objectStorageService } from "./service.ts";
import type { ObjectStorageSettings } from "./settings.ts";

export { BuildContexts, CONTEXT_HASH } from "./contexts.ts";

export interface ObjectStorage {
  backend: ObjectStorageBackend;
  contexts: BuildContexts;
  proxy: S3Proxy;
  impl: ReturnType<typeof objectStorageService>;
  close(): Promise<void>;
}

export async function startObjectStorageService(settings: ObjectStorageSettings, dataDir: string, publicUrl: string, orm: MikroORM, admit: ForeignAdmission): Promise<ObjectStorage> {
  const backend = await startObjectStorage(settings, dataDir);
  const keys = await PushAccessKeys.open(orm);
  const contexts = new BuildContexts(backend);
  return {
    backend,
    contexts,
    proxy: s3Proxy(backend, keys, admit),
    impl: objectStorageService(backend, keys, publicUrl),
    async close() {
      contexts.close();
      await backend.close();
    },
  };
}
