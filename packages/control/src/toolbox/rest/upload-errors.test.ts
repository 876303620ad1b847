import { createHash, randomBytes } from "node:crypto";
import { execFile } from "node:child_process";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import http from "node:http";
import { join } from "node:path";
import { promisify } from "node:util";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SANDBOX_ID_HEADER } from "../../call/call.ts";
import { SANDBOX, startFixture, type Fixture } from "./test-fixture.ts";

// Uploads through control's hand-framed transport to a real agent (its own process): content read
// back by SHA-256 on both ways in (REST multipart, gRPC forwarded), and the calls that end early
// (a path the agent refuses, a full disk, a client that hangs up) answer as before and leave
// nothing open: the agent's call ends (the file it wrote is closed: its descriptors go back).

const run = promisify(execFile);
let f: Fixture;
let small: string | undefined;
beforeAll(async () => {
  f = await startFixture({ agentProcess: true });
  // A 2 MiB file system for the full disk (needs root, as the suites with real sandboxes).
  const dir = join(f.root, "small");
  await mkdir(dir);
  if (process.getuid?.() === 0) {
    await run("mount", ["-t", "tmpfs", "-o", "size=2m", "tmpfs", dir]);
    small = dir;
  }
  // The connection to the agent is open before any test counts the agent's descriptors.
  expect((await bulkUpload(join(f.root, "warm.bin"), 1, randomBytes(MIB))).status).toBe(200);
});
afterAll(async () => {
  if (small) await run("umount", [small]).catch(() => undefined);
  await f?.stop();
});

const MIB = 2 ** 20;
const sha256 = (...chunks: Uint8Array[]) => chunks.reduce((h, c) => h.update(c), createHash("sha256")).digest("hex");

/** The agent process's open descriptors (files it writes show up here). */
const agentFds = async () => (await readdir(`/proc/${f.agentPid}/fd`)).length;

async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const exists = (p: string) => stat(p).then(() => true, () => false);

interface Sent {
  status: number;
  body: string;
}

/**
 * A bulk-upload of `mib` MiB of `block` to `dest`, written with back-pressure by a raw HTTP
 * client; `hangUpAfter` MiB: the client destroys its connection then (the promise rejects).
 */
function bulkUpload(dest: string, mib: number, block: Buffer, hangUpAfter?: number): Promise<Sent> {
  const boundary = "----upctl" + randomBytes(8).toString("hex");
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n${dest}\r\n` +
      `--${boundary}\r\nContent-Disposition: form-data; name="files[0].file"; filename="f.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  );
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
  const url = new URL(`${f.toolbox}/files/bulk-upload`);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname,
      port: url.port,
      method: "POST",
      path: url.pathname,
      headers: { authorization: `Bearer ${f.adminKey}`, "content-type": `multipart/form-data; boundary=${boundary}`, "content-length": head.length + mib * block.length + tail.length },
    });
    req.on("response", (res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c.toString()));
      res.on("end", () => resolve({ status: res.statusCode!, body }));
    });
    req.on("error", reject);
    let sent = 0;
    const pump = () => {
      while (sent < mib) {
        if (hangUpAfter !== undefined && sent >= hangUpAfter) return void setTimeout(() => req.destroy(new Error("hung up")), 200);
        sent++;
        if (!req.write(block, () => undefined)) return void req.once("drain", pump);
      }
      req.end(tail);
    };
    req.write(head);
    pump();
  });
}

describe("uploads through the framed transport", () => {
  it("a REST upload of an odd size reads back byte for byte", async () => {
    const content = randomBytes(3 * MIB + 12345);
    const form = new FormData();
    form.append("files[0].path", join(f.root, "odd/a.bin"));
    form.append("files[0].file", new Blob([content]), "a.bin");
    form.append("files[1].path", join(f.root, "odd/b.bin"));
    form.append("files[1].file", new Blob([content.subarray(0, 77)]), "b.bin");
    const res = await fetch(`${f.toolbox}/files/bulk-upload`, { method: "POST", body: form, headers: { authorization: `Bearer ${f.adminKey}` } });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { files: unknown[] }).files).toEqual([
      { path: join(f.root, "odd/a.bin"), bytes: content.length },
      { path: join(f.root, "odd/b.bin"), bytes: 77 },
    ]);
    expect(sha256(await readFile(join(f.root, "odd/a.bin")))).toBe(sha256(content));
    expect(sha256(await readFile(join(f.root, "odd/b.bin")))).toBe(sha256(content.subarray(0, 77)));
  });

  it("a gRPC client's UploadFile and UploadFiles on the control port (forwarded) read back byte for byte", async () => {
    const client = createClient(FileService, createGrpcTransport({ baseUrl: f.url }));
    const headers = { authorization: `Bearer ${f.adminKey}`, [SANDBOX_ID_HEADER]: SANDBOX };
    // Pieces of every size around the frame size and the varint boundaries.
    const pieces = [1, 127, 128, 16384, 65535, 262143, 262144, 262145, MIB + 1, 0, 9].map((n) => randomBytes(n));
    const dest = join(f.root, "grpc/one.bin");
    async function* one() {
      yield { part: { case: "header" as const, value: { path: dest } } };
      for (const p of pieces) yield { part: { case: "data" as const, value: p } };
    }
    const out = await client.uploadFile(one(), { headers });
    expect(Number(out.file?.bytes)).toBe(pieces.reduce((n, p) => n + p.length, 0));
    expect(sha256(await readFile(dest))).toBe(sha256(...pieces));

    async function* two() {
      yield { part: { case: "header" as const, value: { path: join(f.root, "grpc/a") } } };
      yield { part: { case: "data" as const, value: pieces[4] } };
      yield { part: { case: "data" as const, value: pieces[5] } };
      yield { part: { case: "header" as const, value: { path: join(f.root, "grpc/b") } } };
      yield { part: { case: "data" as const, value: pieces[8] } };
    }
    const both = await client.uploadFiles(two(), { headers });
    expect(both.files.map((x) => Number(x.bytes))).toEqual([pieces[4].length + pieces[5].length, pieces[8].length]);
    expect(sha256(await readFile(join(f.root, "grpc/a")))).toBe(sha256(pieces[4], pieces[5]));
    expect(sha256(await readFile(join(f.root, "grpc/b")))).toBe(sha256(pieces[8]));
  });

  it("a path the agent refuses: its status and message while the body still streams, nothing left open", async () => {
    await writeFile(join(f.root, "plain"), "a file, not a directory");
    const fds = await agentFds();
    const sent = await bulkUpload(join(f.root, "plain/under.bin"), 16, randomBytes(MIB));
    expect(sent.status).toBe(409);
    expect(JSON.parse(sent.body).message).toMatch(/already exists/);
    await until("the agent's descriptors to close", async () => (await agentFds()) <= fds);
    // The connection to the agent still serves.
    const ok = await bulkUpload(join(f.root, "after-refused.bin"), 2, randomBytes(MIB));
    expect(ok.status).toBe(200);
  });

  it("a full disk mid-stream: 400 (not 429: no rate limit) with the agent's message naming the path, nothing left open", async (ctx) => {
    if (!small) return ctx.skip(); // needs root for the tmpfs
    const fds = await agentFds();
    const dest = join(small, "full.bin");
    const sent = await bulkUpload(dest, 8, randomBytes(MIB));
    expect(sent.status).toBe(400);
    expect(JSON.parse(sent.body).message).toBe(`no space left on device: ${dest}`);
    await until("the agent's descriptors to close", async () => (await agentFds()) <= fds);
    // Over gRPC the code stays RESOURCE_EXHAUSTED, with the status REST answers in its metadata.
    const client = createClient(FileService, createGrpcTransport({ baseUrl: f.url }));
    async function* big() {
      yield { part: { case: "header" as const, value: { path: dest } } };
      for (let i = 0; i < 8; i++) yield { part: { case: "data" as const, value: randomBytes(MIB) } };
    }
    const err = ConnectError.from(await client.uploadFile(big(), { headers: { authorization: `Bearer ${f.adminKey}`, [SANDBOX_ID_HEADER]: SANDBOX } }).catch((e: unknown) => e));
    expect([err.code, err.rawMessage, err.metadata.get("x-sandbar-http-status")]).toEqual([Code.ResourceExhausted, `no space left on device: ${dest}`, "400"]);
    await rm(dest, { force: true });
    // Room again: the same session takes the next upload into that file system.
    const block = randomBytes(MIB);
    const ok = await bulkUpload(join(small, "fits.bin"), 1, block);
    expect(ok.status).toBe(200);
    expect(sha256(await readFile(join(small, "fits.bin")))).toBe(sha256(block));
  });

  it("a client that hangs up mid-upload: the agent's call ends, nothing left open, no partial file, an existing one intact", async () => {
    const fds = await agentFds();
    const dir = join(f.root, "hangup");
    const dest = join(dir, "part.bin");
    const kept = join(dir, "kept.bin");
    await mkdir(dir, { recursive: true });
    await writeFile(kept, "the old content");
    const temps = async () => (await readdir(dir)).filter((n) => n.includes(".sandbar-upload-"));
    for (const target of [dest, kept]) {
      const sending = bulkUpload(target, 64, randomBytes(MIB), 8);
      // The upload writes a temporary file beside its target, renamed there only once complete.
      await until("the upload to start", async () => (await temps()).length > 0);
      // The server may answer the broken body before the client's socket is gone: either is fine.
      await sending.catch(() => undefined);
      await until("the agent's descriptors to close", async () => (await agentFds()) <= fds);
      await until("the temporary file to go", async () => (await temps()).length === 0);
    }
    expect(await exists(dest)).toBe(false);
    expect(await readFile(kept, "utf8")).toBe("the old content");
    const block = randomBytes(MIB);
    const ok = await bulkUpload(join(f.root, "after-hangup.bin"), 3, block);
    expect(ok.status).toBe(200);
    expect(sha256(await readFile(join(f.root, "after-hangup.bin")))).toBe(sha256(block, block, block));
  });
});
