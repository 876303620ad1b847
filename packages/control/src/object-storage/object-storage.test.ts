import { randomUUID } from "node:crypto";
import { mkdtemp, rm, writeFile, mkdir } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { CopyObjectCommand, GetObjectCommand, ListObjectsV2Command, PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import * as tar from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { BuildContexts } from "./contexts.ts";
import { PushAccessKeys } from "./push-credentials.ts";

// Object storage against a real server: the embedded s3rver it starts, push-access credentials,
// the server's S3 endpoint checking them (the AWS S3 client and the 0.218 SDK's own uploader as
// clients), and the server reading a context back from the store.

interface Access {
  accessKey: string;
  secret: string;
  sessionToken: string;
  storageUrl: string;
  organizationId: string;
  bucket: string;
  region: string;
}

describe("object storage", () => {
  let t: TestServer;
  let access: Access;
  let scratch: string;
  const s3 = (a: Access, over: Partial<{ secret: string; sessionToken: string }> = {}) =>
    new S3Client({ endpoint: a.storageUrl, region: a.region, forcePathStyle: true, credentials: { accessKeyId: a.accessKey, secretAccessKey: over.secret ?? a.secret, sessionToken: over.sessionToken ?? a.sessionToken } });

  beforeAll(async () => {
    scratch = await mkdtemp(path.join(tmpdir(), "sandbar-objstore-"));
    t = await startTestServer();
    const r = await api(t.url, t.adminKey, "GET", "/object-storage/push-access");
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    access = r.body as Access;
  }, 120_000);
  afterAll(async () => {
    await t?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  it("answers the reference's StorageAccessDto: the server's S3 endpoint, the bucket, the organization", async () => {
    const orgs = await api(t.url, t.adminKey, "GET", "/organizations");
    expect(Object.keys(access).sort()).toEqual(["accessKey", "bucket", "organizationId", "region", "secret", "sessionToken", "storageUrl"]);
    expect(access).toMatchObject({ storageUrl: `${t.url}/s3`, bucket: "sandbar-builds", region: "us-east-1", organizationId: orgs.body[0].id });
    expect(access.accessKey).toMatch(/^SBR[0-9A-F]{20}$/);
    // A new set each time; the embedded store's own key is never handed out.
    const again = (await api(t.url, t.adminKey, "GET", "/object-storage/push-access")).body as Access;
    expect(again.accessKey).not.toBe(access.accessKey);
    expect(JSON.stringify(again)).not.toContain("S3RVER");
  });

  it("needs write:snapshots or write:sandboxes", async () => {
    const key = async (permissions: string[]) => (await api(t.url, t.adminKey, "POST", "/api-keys", { name: `k-${permissions.join("-") || "none"}-${Date.now()}`, permissions })).body.value as string;
    const none = await api(t.url, await key(["write:volumes"]), "GET", "/object-storage/push-access");
    expect(none.status).toBe(403);
    expect(none.body.message).toMatch(/write:snapshots or write:sandboxes/);
    expect((await api(t.url, await key(["write:sandboxes"]), "GET", "/object-storage/push-access")).status).toBe(200);
    expect((await api(t.url, await key(["write:snapshots"]), "GET", "/object-storage/push-access")).status).toBe(200);
    expect((await api(t.url, undefined, "GET", "/object-storage/push-access")).status).toBe(401);
  });

  it("lets the organization put, list and get under its prefix, and the server read the context back", async () => {
    const client = s3(access);
    const key = `${access.organizationId}/abc123/context.tar`;
    await client.send(new PutObjectCommand({ Bucket: access.bucket, Key: key, Body: "tar bytes" }));
    const listed = await client.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${access.organizationId}/abc123/`, MaxKeys: 1 }));
    expect(listed.Contents?.map((c) => c.Key)).toEqual([key]);
    const got = await client.send(new GetObjectCommand({ Bucket: access.bucket, Key: key }));
    expect(await got.Body!.transformToString()).toBe("tar bytes");
    // The build side reads it from the store directly, streamed.
    const contexts = new BuildContexts(t.server.objectStorage.backend);
    const chunks: Buffer[] = [];
    for await (const c of await contexts.open(access.organizationId, "abc123")) chunks.push(c as Buffer);
    expect(Buffer.concat(chunks).toString()).toBe("tar bytes");
    await expect(contexts.open(access.organizationId, "nope")).rejects.toThrow(/Build context nope not found in object storage/);
    await expect(contexts.open(access.organizationId, "../x")).rejects.toThrow(/is not a context hash/);
    contexts.close();
  });

  it("refuses other organizations' prefixes, other buckets, traversal, copies and bad signatures", async () => {
    const client = s3(access);
    const other = randomUUID();
    const denied = async (p: Promise<unknown>, name: string) => {
      const err = (await p.then(() => undefined, (e: unknown) => e)) as { name?: string; $metadata?: { httpStatusCode?: number } } | undefined;
      expect(err?.name, `expected ${name}`).toBe(name);
    };
    await denied(client.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${other}/h/context.tar`, Body: "x" })), "AccessDenied");
    await denied(client.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${other}/h/context.tar` })), "AccessDenied");
    await denied(client.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${other}/` })), "AccessDenied");
    await denied(client.send(new ListObjectsV2Command({ Bucket: access.bucket })), "AccessDenied");
    await denied(client.send(new PutObjectCommand({ Bucket: "another-bucket", Key: `${access.organizationId}/h/context.tar`, Body: "x" })), "AccessDenied");
    await denied(client.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${access.organizationId}/../${other}/h/context.tar`, Body: "x" })), "AccessDenied");
    await denied(client.send(new CopyObjectCommand({ Bucket: access.bucket, Key: `${access.organizationId}/h/y`, CopySource: `${access.bucket}/${other}/h/context.tar` })), "AccessDenied");
    await denied(s3(access, { secret: "wrong" }).send(new GetObjectCommand({ Bucket: access.bucket, Key: `${access.organizationId}/abc123/context.tar` })), "SignatureDoesNotMatch");
    // A token for another organization, with this key's signature: the token's MAC fails.
    const [payload, mac] = access.sessionToken.split(".");
    const forged = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(payload!, "base64url").toString()), o: other })).toString("base64url") + "." + mac;
    await denied(s3(access, { sessionToken: forged }).send(new GetObjectCommand({ Bucket: access.bucket, Key: `${other}/h/context.tar` })), "InvalidAccessKeyId");
    // Expired credentials (issued two hours ago with the server's key).
    const keys = await PushAccessKeys.open(t.server.orm);
    const old = keys.issue(access.organizationId, Date.now() - 2 * 3600_000);
    await denied(s3({ ...access, accessKey: old.accessKeyId, secret: old.secretAccessKey, sessionToken: old.sessionToken }).send(new GetObjectCommand({ Bucket: access.bucket, Key: `${access.organizationId}/abc123/context.tar` })), "ExpiredToken");
    // Unsigned requests never reach the store.
    const anon = await fetch(`${access.storageUrl}/${access.bucket}/${access.organizationId}/abc123/context.tar`);
    expect(anon.status).toBe(403);
    expect(await anon.text()).toMatch(/Signature Version 4/);
  });

  it("takes the 0.218 SDK's context upload (tar, multipart for big ones) and skips a hash already there", async () => {
    const require = createRequire(import.meta.url);
    const { ObjectStorage } = require(path.join(path.dirname(require.resolve("sdk-0218")), "ObjectStorage.js")) as { ObjectStorage: new (c: object) => { upload(p: string, org: string, archive: string): Promise<string> } };
    const dir = path.join(scratch, "ctx");
    await mkdir(path.join(dir, "sub"), { recursive: true });
    await writeFile(path.join(dir, "a.txt"), "alpha\n");
    await writeFile(path.join(dir, "sub", "big.bin"), Buffer.alloc(7 * 1024 * 1024, 7)); // past one 5 MiB part
    const store = new ObjectStorage({ endpointUrl: access.storageUrl, accessKeyId: access.accessKey, secretAccessKey: access.secret, sessionToken: access.sessionToken, bucketName: access.bucket, region: access.region });
    const hash = await store.upload(dir, access.organizationId, dir.slice(1));
    expect(hash).toMatch(/^[0-9a-f]{32}$/);
    const contexts = new BuildContexts(t.server.objectStorage.backend);
    const entries: Array<{ path: string; size: number }> = [];
    const { pipeline } = await import("node:stream/promises");
    await pipeline(await contexts.open(access.organizationId, hash), tar.t({ onReadEntry: (e) => entries.push({ path: e.path, size: e.size }) }));
    expect(entries).toEqual(expect.arrayContaining([{ path: `${dir.slice(1)}/a.txt`, size: 6 }, { path: `${dir.slice(1)}/sub/big.bin`, size: 7 * 1024 * 1024 }]));
    expect(await store.upload(dir, access.organizationId, dir.slice(1))).toBe(hash);
    contexts.close();
  }, 60_000);
});

describe("object storage on an operator's S3 (SANDBAR_S3_ENDPOINT)", () => {
  // The "operator's S3" is another s3rver the test starts, reached only by the server: the
  // client's requests go through the server's endpoint and land there, re-signed.
  let t: TestServer;
  let dir: string;
  let ops: { run(): Promise<{ port: number }>; close(): Promise<void> };
  let endpoint: string;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), "sandbar-ops-s3-"));
    const S3rver = createRequire(import.meta.url)("s3rver") as new (o: object) => typeof ops;
    ops = new S3rver({ address: "127.0.0.1", port: 0, silent: true, directory: dir, configureBuckets: [{ name: "ops-contexts" }], vhostBuckets: false });
    endpoint = `http://127.0.0.1:${(await ops.run()).port}`;
    t = await startTestServer({ settings: { objectStorage: { endpoint, accessKey: "S3RVER", secretKey: "S3RVER", bucket: "ops-contexts", region: "eu-west-1" } } });
  }, 120_000);
  afterAll(async () => {
    await t?.stop();
    await ops?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("hands out the server's endpoint, never the operator's, and stores there", async () => {
    const a = (await api(t.url, t.adminKey, "GET", "/object-storage/push-access")).body as Access;
    expect(a).toMatchObject({ storageUrl: `${t.url}/s3`, bucket: "ops-contexts", region: "eu-west-1" });
    expect(JSON.stringify(a)).not.toContain(endpoint);
    const client = new S3Client({ endpoint: a.storageUrl, region: a.region, forcePathStyle: true, credentials: { accessKeyId: a.accessKey, secretAccessKey: a.secret, sessionToken: a.sessionToken } });
    await client.send(new PutObjectCommand({ Bucket: a.bucket, Key: `${a.organizationId}/ops/context.tar`, Body: "operator bytes" }));
    const direct = new S3Client({ endpoint, region: "eu-west-1", forcePathStyle: true, credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" } });
    const got = await direct.send(new GetObjectCommand({ Bucket: "ops-contexts", Key: `${a.organizationId}/ops/context.tar` }));
    expect(await got.Body!.transformToString()).toBe("operator bytes");
    direct.destroy();
  });
});
