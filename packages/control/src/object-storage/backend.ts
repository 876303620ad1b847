import { mkdir } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import { createRequire } from "node:module";
import path from "node:path";
import type { ObjectStorageSettings } from "./settings.ts";

// The store behind the server's S3 endpoint: the operator's (SANDBAR_S3_ENDPOINT) or an embedded
// s3rver (the npm package: the S3 protocol over a directory) on a loopback port, kept in
// <data dir>/object-storage. s3rver has no IAM: nothing but this process is given its address,
// and clients only ever reach it through the checked endpoint (s3-proxy.ts).

export interface ObjectStorageBackend {
  /** Base URL of the S3 service (path-style requests go to <endpoint>/<bucket>/<key>). */
  endpoint: string;
  region: string;
  bucket: string;
  credentials: { accessKeyId: string; secretAccessKey: string };
  /** Whether it is the embedded s3rver. */
  embedded: boolean;
  close(): Promise<void>;
}

interface S3rverInstance {
  run(): Promise<AddressInfo>;
  close(): Promise<void>;
}
type S3rverClass = new (o: { address: string; port: number; silent: boolean; directory: string; configureBuckets: Array<{ name: string }>; vhostBuckets: boolean }) => S3rverInstance;

// s3rver's one built-in account (it checks signatures against it).
const S3RVER_KEY = "S3RVER";

export async function startObjectStorage(settings: ObjectStorageSettings, dataDir: string): Promise<ObjectStorageBackend> {
  if (settings.endpoint) {
    return {
      endpoint: settings.endpoint,
      region: settings.region,
      bucket: settings.bucket,
      credentials: { accessKeyId: settings.accessKey!, secretAccessKey: settings.secretKey! },
      embedded: false,
      close: async () => undefined,
    };
  }
  const directory = path.join(dataDir, "object-storage");
  await mkdir(directory, { recursive: true, mode: 0o700 });
  const S3rver = createRequire(import.meta.url)("s3rver") as S3rverClass;
  const server = new S3rver({ address: "127.0.0.1", port: 0, silent: true, directory, configureBuckets: [{ name: settings.bucket }], vhostBuckets: false });
  const address = await server.run();
  return {
    endpoint: `http://127.0.0.1:${address.port}`,
    region: settings.region,
    bucket: settings.bucket,
    credentials: { accessKeyId: S3RVER_KEY, secretAccessKey: S3RVER_KEY },
    embedded: true,
    close: () => server.close(),
  };
}
