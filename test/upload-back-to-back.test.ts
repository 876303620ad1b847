import { createHash, randomBytes } from "node:crypto";
import { readFile, rm } from "node:fs/promises";
import http from "node:http";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildAgentBundle, bulkUpload, sandboxCgroup, startTestServer, type TestServer } from "@sandbar/control/testing";

// Large uploads back to back into a real sandbox (real control server, real agent, the home on
// the sandbox's loop-mounted disk in direct I/O, its memory cgroup): the second runs into what
// the first left in the sandbox's page cache (dirty, up to the cgroup's limit), and its pages go
// through the loop device while the sandbox writes. Every byte reads back as sent.

const MiB = 2 ** 20;
const SIZE_MIB = 256;
let t: TestServer;
let bundle: string;

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error("this suite runs real sandboxes: run it as root");
  bundle = await buildAgentBundle("sandbar-upload-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle } });
}, 120_000);
afterAll(async () => {
  await t?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

function call(method: string, p: string, body?: unknown): Promise<{ status: number; text: string }> {
  const url = new URL(t.url);
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: url.hostname, port: url.port, method, path: `/api${p}`, headers: { authorization: `Bearer ${t.adminKey}`, ...(payload ? { "content-type": "application/json" } : {}) } },
      (res) => {
        let text = "";
        res.on("data", (c: Buffer) => (text += c.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
      },
    );
    req.on("error", reject);
    req.end(payload);
  });
}

/** Different bytes per MiB (index in the first bytes), so a misplaced or lost chunk changes the hash. */
function chunk(i: number): Buffer {
  const b = randomBytes(MiB);
  b.writeUInt32BE(i, 0);
  return b;
}

/** A multipart bulk-upload of `mib` MiB streamed with back-pressure; resolves to the sent bytes' sha256. */
async function upload(id: string, dest: string, mib: number): Promise<string> {
  const sent = createHash("sha256");
  await bulkUpload({ url: t.url, key: t.adminKey, sandboxId: id, dest, mib, chunk: (i) => {
    const c = chunk(i);
    sent.update(c);
    return c;
  } });
  return sent.digest("hex");
}

function downloadHash(id: string, file: string): Promise<{ bytes: number; sha256: string }> {
  const url = new URL(t.url);
  return new Promise((resolve, reject) => {
    http
      .get({ host: url.hostname, port: url.port, path: `/api/toolbox/${id}/toolbox/files/download?path=${encodeURIComponent(file)}`, headers: { authorization: `Bearer ${t.adminKey}` } }, (res) => {
        if (res.statusCode !== 200) return reject(new Error(`download answered ${res.statusCode}`));
        const h = createHash("sha256");
        let bytes = 0;
        res.on("data", (c: Buffer) => {
          h.update(c);
          bytes += c.length;
        });
        res.on("end", () => resolve({ bytes, sha256: h.digest("hex") }));
        res.on("error", reject);
      })
      .on("error", reject);
  });
}

/** Dirty page-cache bytes charged to the sandbox (its memory cgroup and the groups under it). */
async function dirtyBytes(memcg: string): Promise<number> {
  const stat = await readFile(path.join(memcg, "memory.stat"), "utf8");
  const v1 = /^total_dirty (\d+)$/m.exec(stat);
  const v2 = /^file_dirty (\d+)$/m.exec(stat);
  return Number((v1 ?? v2)![1]);
}

/** The loop device the sandbox's disk is mounted from, and whether it does direct I/O. */
async function loopDio(id: string): Promise<string> {
  for (const line of (await readFile("/proc/self/mountinfo", "utf8")).split("\n")) {
    const [fields, after] = line.split(" - ");
    if (!after || !fields.split(" ")[4].includes(id)) continue;
    const m = /^ext4 \/dev\/(loop\d+) /.exec(after);
    if (m) return (await readFile(`/sys/block/${m[1]}/loop/dio`, "utf8")).trim();
  }
  throw new Error(`no loop-mounted disk for sandbox ${id}`);
}

describe("large uploads back to back", () => {
  it(`two ${SIZE_MIB} MiB uploads through REST into a disk in direct I/O both read back byte for byte`, async () => {
    const created = await call("POST", "/sandbox", { memory: 1, disk: 3 });
    expect(created.status).toBe(200);
    const id = (JSON.parse(created.text) as { id: string }).id;
    try {
      const memcg = (await sandboxCgroup("/sys/fs/cgroup/memory", id)) ?? (await sandboxCgroup("/sys/fs/cgroup", id));
      expect(memcg, "the sandbox's memory cgroup").toBeDefined();
      expect(await loopDio(id)).toBe("1");
      const home = (JSON.parse((await call("POST", `/toolbox/${id}/toolbox/process/execute`, { command: 'printf %s "$HOME"' })).text) as { result: string }).result;

      let peak = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          peak = Math.max(peak, await dirtyBytes(memcg!));
          await new Promise((r) => setTimeout(r, 50));
        }
      })();
      const sums: string[] = [];
      const rates: string[] = [];
      try {
        for (const name of ["first.bin", "second.bin"]) {
          const t0 = performance.now();
          sums.push(await upload(id, `${home}/${name}`, SIZE_MIB));
          rates.push(((SIZE_MIB * MiB) / 1e6 / ((performance.now() - t0) / 1000)).toFixed(0));
        }
      } finally {
        sampling = false;
        await sampler;
      }
      // The agent starts a finished upload's writeback at once (files/transfer.ts): its dirty pages
      // are written within seconds, not when the host's 30 s expiry or GB thresholds come.
      const t1 = performance.now();
      let dirty = await dirtyBytes(memcg!);
      while (dirty > 32 * MiB && performance.now() - t1 < 10_000) {
        await new Promise((r) => setTimeout(r, 100));
        dirty = await dirtyBytes(memcg!);
      }
      console.log(`two ${SIZE_MIB} MiB uploads: ${rates.join(", ")} MB/s; the sandbox's dirty pages peaked at ${(peak / MiB).toFixed(0)} MiB (not a limit: a figure), ${(dirty / MiB).toFixed(0)} MiB ${((performance.now() - t1) / 1000).toFixed(1)} s after`);
      expect(dirty, "the sandbox's dirty pages 10 s after the uploads").toBeLessThanOrEqual(32 * MiB);

      expect(await downloadHash(id, `${home}/first.bin`)).toEqual({ bytes: SIZE_MIB * MiB, sha256: sums[0] });
      expect(await downloadHash(id, `${home}/second.bin`)).toEqual({ bytes: SIZE_MIB * MiB, sha256: sums[1] });
    } finally {
      expect((await call("DELETE", `/sandbox/${id}`)).status).toBe(200);
    }
  }, 300_000);
});
