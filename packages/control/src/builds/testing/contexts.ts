import { copyFile, mkdir, realpath } from "node:fs/promises";
import path from "node:path";
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import * as tar from "tar";

type Call = (method: string, p: string, body?: unknown) => Promise<{ body: unknown }>;

/** What `GET /object-storage/push-access` answers (the fields an upload uses). */
interface PushAccess {
  storageUrl: string;
  region: string;
  accessKey: string;
  secret: string;
  sessionToken: string;
  bucket: string;
  organizationId: string;
}

/** Uploads a build context as a client does: push access, then the AWS S3 client, to `<org>/<hash>/context.tar`. */
export async function uploadContext(call: Call, hash: string, archive: Buffer): Promise<void> {
  const a = (await call("GET", "/object-storage/push-access")).body as PushAccess;
  const s3 = new S3Client({ endpoint: a.storageUrl, region: a.region, forcePathStyle: true, credentials: { accessKeyId: a.accessKey, secretAccessKey: a.secret, sessionToken: a.sessionToken } });
  try {
    await s3.send(new PutObjectCommand({ Bucket: a.bucket, Key: `${a.organizationId}/${hash}/context.tar`, Body: archive }));
  } finally {
    s3.destroy();
  }
}

/** A tar archive of `entries` under `cwd`. */
export async function tarOf(cwd: string, entries: string[], options: { preservePaths?: boolean } = {}): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of tar.c({ cwd, portable: true, ...options }, entries)) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** The context the build tests use: the host's `sleep` as `bin/sleep`, uploaded as `sleepctx`. */
export async function uploadSleepContext(call: Call, scratch: string): Promise<void> {
  const ctx = path.join(scratch, "ctx");
  await mkdir(path.join(ctx, "bin"), { recursive: true });
  await copyFile(await realpath("/bin/sleep"), path.join(ctx, "bin/sleep"));
  await uploadContext(call, "sleepctx", await tarOf(ctx, ["bin"]));
}
