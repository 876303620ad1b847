import type { Readable } from "node:stream";
import { GetObjectCommand, NoSuchKey, S3Client } from "@aws-sdk/client-s3";
import { errors } from "@sandbar/protocol";
import type { ObjectStorageBackend } from "./backend.ts";

// Build contexts as the clients upload them: `<organizationId>/<hash>/context.tar` in the bucket,
// read by the server straight from the store (streamed) with the store's own credentials.

/** A context hash as the clients make them (md5 hex); anything else never names a key. */
export const CONTEXT_HASH = /^[A-Za-z0-9_-]{1,128}$/;

export class BuildContexts {
  readonly #backend: ObjectStorageBackend;
  readonly #client: S3Client;

  constructor(backend: ObjectStorageBackend) {
    this.#backend = backend;
    this.#client = new S3Client({ endpoint: backend.endpoint, region: backend.region, credentials: backend.credentials, forcePathStyle: true });
  }

  static key(organizationId: string, hash: string): string {
    return `${organizationId}/${hash}/context.tar`;
  }

  /** The context's tar stream; failedPrecondition naming the hash when it is not in storage. */
  async open(organizationId: string, hash: string, signal?: AbortSignal): Promise<Readable> {
    if (!CONTEXT_HASH.test(hash)) throw errors.invalidArgument(`buildInfo.contextHashes: "${hash.slice(0, 40)}" is not a context hash`);
    try {
      const out = await this.#client.send(new GetObjectCommand({ Bucket: this.#backend.bucket, Key: BuildContexts.key(organizationId, hash) }), { abortSignal: signal });
      return out.Body as Readable;
    } catch (err) {
      if (err instanceof NoSuchKey || (err as { name?: string }).name === "NoSuchKey" || (err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode === 404) {
        throw errors.failedPrecondition(`Build context ${hash} not found in object storage (upload it first: ${BuildContexts.key(organizationId, hash)})`);
      }
      throw errors.unavailable(`object storage: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  close(): void {
    this.#client.destroy();
  }
}
