import { createHash, randomBytes } from "node:crypto";
import { execFile } from "node:child_process";
import { createReadStream } from "node:fs";
import { mkdir, open, readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { Readable } from "node:stream";
import busboy from "busboy";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startFixture, toolboxFetch, type Fixture } from "./test-fixture.ts";
import type { UntypedJson } from "../../casts.ts";

// Bulk and single uploads and downloads through the control server's REST toolbox into a real
// agent, byte for byte, in the multipart shapes the SDKs write and parse.

let f: Fixture;
beforeAll(async () => {
  // The agent runs as its own process so that this process's memory is the control plane's.
  f = await startFixture({ agentProcess: true });
});
afterAll(async () => f?.stop());

interface Part {
  name: string;
  filename: string | undefined;
  mimeType: string;
  size: number;
  sha256: string;
  text: string;
}

/** Parses a multipart response as the SDKs do (busboy, preservePath), hashing parts as they stream. */
async function parseMultipart(res: Response): Promise<Part[]> {
  const parts: Part[] = [];
  const bb = busboy({ headers: { "content-type": res.headers.get("content-type") ?? "" }, preservePath: true });
  const done = new Promise<void>((resolve, reject) => {
    bb.on("file", (name, stream, info) => {
      const hash = createHash("sha256");
      let size = 0;
      const head: Buffer[] = [];
      stream.on("data", (c: Buffer) => {
        hash.update(c);
        if (size < 4096) head.push(c);
        size += c.length;
      });
      stream.on("end", () => parts.push({ name, filename: info.filename, mimeType: info.mimeType, size, sha256: hash.digest("hex"), text: Buffer.concat(head).toString("utf8") }));
    });
    bb.on("close", resolve);
    bb.on("error", reject);
  });
  Readable.fromWeb(res.body!).pipe(bb);
  await done;
  return parts;
}

const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");

async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const c of createReadStream(path)) hash.update(c as Buffer);
  return hash.digest("hex");
}

/** Writes `mb` MiB of random bytes without holding them in memory. */
async function bigFile(path: string, mb: number): Promise<void> {
  const fh = await open(path, "w");
  const block = randomBytes(1024 * 1024);
  for (let i = 0; i < mb; i++) {
    block.writeUInt32BE(i, 0);
    await fh.write(block);
  }
  await fh.close();
}

const gc = (() => {
  setFlagsFromString("--expose-gc");
  return runInNewContext("gc") as (options?: { type: "major" | "minor" }) => void;
})();

/**
 * Runs `work` while watching this process's memory: the peak growth of its RSS, and the peak of
 * its live buffer memory (sampled right after full collections, so garbage does not count) —
 * the direct sign of a buffered file. In MiB.
 */
async function memoryGrowth(work: () => Promise<void>): Promise<{ rss: number; liveBuffers: number }> {
  gc({ type: "major" });
  const start = process.memoryUsage();
  let rss = start.rss;
  let live = start.arrayBuffers;
  const fast = setInterval(() => (rss = Math.max(rss, process.memoryUsage().rss)), 5);
  const slow = setInterval(() => {
    gc({ type: "major" });
    // Dead buffers' memory is released by a sweeper shortly after the collection.
    setTimeout(() => (live = Math.max(live, process.memoryUsage().arrayBuffers)), 50);
  }, 250);
  try {
    await work();
  } finally {
    clearInterval(fast);
    clearInterval(slow);
  }
  const mib = (n: number) => n / (1024 * 1024);
  return { rss: mib(Math.max(rss, process.memoryUsage().rss) - start.rss), liveBuffers: mib(live - start.arrayBuffers) };
}

describe("bulk upload", () => {
  it("writes several files byte for byte, an empty one included, in the SDK's field order", async () => {
    const files = [
      { path: join(f.root, "up/a.txt"), data: Buffer.from("hello\n") },
      { path: join(f.root, "up/empty.bin"), data: Buffer.alloc(0) },
      { path: join(f.root, "up/deep/er/bin.dat"), data: randomBytes(300_000) },
      { path: "relative/r.txt", data: Buffer.from("relative to the work dir") },
    ];
    const form = new FormData();
    files.forEach((file, i) => {
      form.append(`files[${i}].path`, file.path);
      form.append(`files[${i}].file`, new Blob([file.data]), file.path.split("/").pop());
    });
    const res = await toolboxFetch(f, "/files/bulk-upload", { method: "POST", body: form });
    expect(res.status).toBe(200);
    const body = (await res.json() as UntypedJson);
    expect(body.files.map((x: { bytes: number }) => x.bytes)).toEqual(files.map((x) => x.data.length));
    for (const file of files) {
      const onDisk = await readFile(file.path.startsWith("/") ? file.path : join(f.root, file.path));
      expect(sha256(onDisk)).toBe(sha256(file.data));
    }
  });

  it("refuses a file part without its path before it, and a malformed body", async () => {
    const form = new FormData();
    form.append("files[0].file", new Blob(["x"]), "x");
    form.append("files[0].path", join(f.root, "never.txt"));
    const res = await toolboxFetch(f, "/files/bulk-upload", { method: "POST", body: form });
    expect(res.status).toBe(400);
    expect((await res.json() as UntypedJson).message).toMatch(/files\[0\]\.path/);
    await expect(stat(join(f.root, "never.txt"))).rejects.toThrow();

    const truncated = "--XYZ\r\nContent-Disposition: form-data; name=\"files[0].path\"\r\n\r\n" + join(f.root, "t.txt") + "\r\n--XYZ\r\nContent-Disposition: form-data; name=\"files[0].file\"; filename=\"t\"\r\n\r\npartial";
    const bad = await toolboxFetch(f, "/files/bulk-upload", { method: "POST", body: truncated, headers: { "content-type": "multipart/form-data; boundary=XYZ" } });
    expect(bad.status).toBe(400);
    expect((await bad.json() as UntypedJson).statusCode).toBe(400);

    const notMultipart = await toolboxFetch(f, "/files/bulk-upload", { method: "POST", body: "{}", headers: { "content-type": "application/json" } });
    expect(notMultipart.status).toBe(400);
  });

  it("checks credentials before taking the body", async () => {
    const form = new FormData();
    form.append("files[0].path", join(f.root, "unauth.txt"));
    form.append("files[0].file", new Blob(["no"]), "unauth.txt");
    const res = await toolboxFetch(f, "/files/bulk-upload", { method: "POST", body: form, headers: { authorization: "Bearer nope" } });
    expect(res.status).toBe(401);
    const other = await fetch(`${f.url}/api/toolbox/other/toolbox/files/bulk-upload`, { method: "POST", body: form, headers: { authorization: `Bearer ${f.adminKey}` } });
    expect(other.status).toBe(404);
    expect((await other.json() as UntypedJson).statusCode).toBe(404);
    await expect(stat(join(f.root, "unauth.txt"))).rejects.toThrow();
  });
});

describe("single upload and download", () => {
  it("uploads the multipart field `file` to ?path= and downloads it raw", async () => {
    const data = randomBytes(70_000);
    const form = new FormData();
    form.append("file", new Blob([data]), "ignored-name");
    const target = join(f.root, "single/one.bin");
    const up = await toolboxFetch(f, `/files/upload?path=${encodeURIComponent(target)}`, { method: "POST", body: form });
    expect(up.status).toBe(200);
    expect(sha256(await readFile(target))).toBe(sha256(data));

    const down = await toolboxFetch(f, `/files/download?path=${encodeURIComponent(target)}`);
    expect(down.status).toBe(200);
    expect(down.headers.get("content-type")).toBe("application/octet-stream");
    expect(sha256(Buffer.from(await down.arrayBuffer()))).toBe(sha256(data));

    const missing = await toolboxFetch(f, `/files/download?path=${encodeURIComponent(join(f.root, "nope"))}`);
    expect(missing.status).toBe(404);
    expect((await missing.json() as UntypedJson).statusCode).toBe(404);
    const noPath = await toolboxFetch(f, "/files/upload", { method: "POST", body: form });
    expect(noPath.status).toBe(400);
  });
});

describe("bulk download", () => {
  it("answers one part per path, in order, with the requested path as filename and error parts", async () => {
    await mkdir(join(f.root, "dl"), { recursive: true });
    const a = join(f.root, "dl/a.txt");
    const weird = join(f.root, 'dl/we"ird \\ näme ✓.txt');
    const empty = join(f.root, "dl/empty");
    const bin = join(f.root, "dl/bin");
    const binData = randomBytes(600_000);
    await writeFile(a, "hello");
    await writeFile(weird, "weird");
    await writeFile(empty, "");
    await writeFile(bin, binData);
    const paths = [a, join(f.root, "dl/missing.txt"), weird, empty, join(f.root, "dl"), bin, "dl/a.txt"];
    const res = await toolboxFetch(f, "/files/bulk-download", { method: "POST", body: JSON.stringify({ paths }), headers: { "content-type": "application/json" } });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^multipart\/form-data; boundary=/);
    const parts = await parseMultipart(res);
    expect(parts.map((p) => [p.name, p.filename])).toEqual([
      ["file", a],
      ["error", paths[1]],
      ["file", weird],
      ["file", empty],
      ["error", paths[4]],
      ["file", bin],
      ["file", "dl/a.txt"],
    ]);
    expect(parts[0].text).toBe("hello");
    expect(parts[2].text).toBe("weird");
    expect(parts[3].size).toBe(0);
    expect(parts[5].sha256).toBe(sha256(binData));
    expect(parts[6].text).toBe("hello");
    const missing = JSON.parse(parts[1].text);
    expect(missing).toMatchObject({ statusCode: 404, code: "FILE_NOT_FOUND", path: paths[1], method: "POST" });
    expect(parts[1].mimeType).toBe("application/json");
    expect(JSON.parse(parts[4].text)).toMatchObject({ statusCode: 400, path: paths[4] });
  });

  it("is 400 for a bad body or no paths", async () => {
    const none = await toolboxFetch(f, "/files/bulk-download", { method: "POST", body: JSON.stringify({ paths: [] }), headers: { "content-type": "application/json" } });
    expect(none.status).toBe(400);
    const bad = await toolboxFetch(f, "/files/bulk-download", { method: "POST", body: JSON.stringify({ paths: "x" }), headers: { "content-type": "application/json" } });
    expect(bad.status).toBe(400);
    expect((await bad.json() as UntypedJson).message).toMatch(/paths must be an array/);
  });
});

describe("large files stream through", () => {
  // SANDBAR_TRANSFER_MB=256 SANDBAR_REPORT=1 measures the throughput figures of the report.
  // 96 MiB: three times the live-buffer bound below, so buffering shows while a loaded machine's
  // garbage (29 MiB seen once at 50 MiB, bound 25) does not.
  const MB = Number(process.env.SANDBAR_TRANSFER_MB ?? 96);
  // curl is the client here (its own process, streaming from and to disk), so this process's
  // memory is the control plane's: a buffered file would show up whole.
  const curl = (args: string[]) =>
    new Promise<string>((resolve, reject) =>
      execFile("curl", ["-sS", "--fail-with-body", "-H", `authorization: Bearer ${f.adminKey}`, ...args], { maxBuffer: 1024 * 1024 }, (err, stdout, stderr) =>
        err ? reject(new Error(`${err.message}\n${stderr}${stdout}`)) : resolve(stdout),
      ),
    );
  const upload = (src: string, dest: string) => curl(["-F", `files[0].path=${dest}`, "-F", `files[0].file=@${src}`, "-F", `files[1].path=${dest}.after`, "-F", "files[1].file=@/dev/null;filename=after", `${f.toolbox}/files/bulk-upload`]);
  const download = (paths: string[], out: string) =>
    curl(["-D", `${out}.headers`, "-o", out, "-H", "content-type: application/json", "-d", JSON.stringify({ paths }), `${f.toolbox}/files/bulk-download`]);

  it(`uploads and downloads ${MB} MiB byte for byte while the control process's memory stays flat`, async () => {
    const work = join(f.root, "..");
    const src = join(work, "big-src.bin");
    await bigFile(src, MB);
    const srcHash = await sha256File(src);
    const dest = join(f.root, "big/dest.bin");

    // Warm-up: the first transfer grows the heap and the allocator's arenas once.
    await bigFile(join(work, "warm.bin"), 16);
    await upload(join(work, "warm.bin"), join(f.root, "big/warm.bin"));
    await download([join(f.root, "big/warm.bin")], join(work, "warm.multipart"));

    let t0 = performance.now();
    const up = await memoryGrowth(async () => {
      expect(JSON.parse(await upload(src, dest))).toEqual({ files: [{ path: dest, bytes: MB * 1024 * 1024 }, { path: `${dest}.after`, bytes: 0 }] });
    });
    const upSeconds = (performance.now() - t0) / 1000;
    expect(await sha256File(dest)).toBe(srcHash);
    expect((await stat(`${dest}.after`)).size).toBe(0);

    const out = join(work, "big.multipart");
    t0 = performance.now();
    const down = await memoryGrowth(() => download([dest, `${dest}.after`], out).then(() => undefined));
    const downSeconds = (performance.now() - t0) / 1000;
    const contentType = /content-type: (.*)\r\n/i.exec(await readFile(`${out}.headers`, "utf8"))![1];
    const parts = await parseMultipart(new Response(Readable.toWeb(createReadStream(out)) as ReadableStream, { headers: { "content-type": contentType } }));
    expect(parts.map((p) => [p.filename, p.size])).toEqual([
      [dest, MB * 1024 * 1024],
      [`${dest}.after`, 0],
    ]);
    expect(parts[0].sha256).toBe(srcHash);
    if (process.env.SANDBAR_REPORT) {
      const rate = (s: number) => `${(MB / s).toFixed(1)} MiB/s`;
      console.log(`${MB} MiB: upload ${rate(upSeconds)}, download ${rate(downSeconds)}; memory growth (MiB):`, { up, down });
    }
    // Buffering the file would hold it whole in this process (the sharp test is the live
    // buffers; resident memory also moves with garbage between collections). A stream to the
    // agent holds up to ~20 MiB whatever the file's size (HTTP/2 windows, envelopes).
    const bound = Math.min(MB / 2, 32);
    expect(up.liveBuffers).toBeLessThan(bound);
    expect(down.liveBuffers).toBeLessThan(bound);
    expect(up.rss).toBeLessThan(MB * 0.75);
    expect(down.rss).toBeLessThan(MB * 0.75);
  }, 180_000);
});
