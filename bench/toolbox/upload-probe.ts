// Upload probe: back-to-back uploads into one sandbox's home (REST bulk-upload and agent direct, in
// turns), with what the kernel does meanwhile: dirty and writeback pages (host-wide and in the
// sandbox's memory cgroup), the sandbox's loop device settings, and where the agent's threads wait.
// Each upload is read back through REST and its SHA-256 compared with what was sent.
//
//   node bench/toolbox/upload-probe.ts [MiB=256] [rounds=3] [--trace] [--dio-ab] [--pieces] [--bundle <dir>]
//   (as root; prints only)
//
// --trace: a line per 200 ms sample (Dirty, Writeback host-wide; the cgroup's dirty/writeback/cache;
// the agent threads' kernel wait channels).
// --dio-ab: the loop device's direct I/O off in even rounds, on in odd ones (losetup on the bound
// device): an interleaved A/B on one sandbox.
// --pieces: agent direct also in control's 256 KiB messages. --bundle: an agent bundle built
// elsewhere (`node packages/agent/build.ts <dir>`), to compare agents.
import { createHash, randomBytes } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import http from "node:http";
import { execFileSync } from "node:child_process";
import * as path from "node:path";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { bulkUpload } from "../../packages/control/src/testing/bulk-upload.ts";
import { sandboxCgroup } from "../../packages/control/src/testing/sandbox-cgroup.ts";
import { AgentClients } from "../../packages/control/src/toolbox/agent-clients.ts";
import type { AgentDial } from "../../packages/control/src/sandboxes/runtime.ts";
import { loadAvg, log, requireRoot, startBenchServer } from "../sandboxes/support.ts";

requireRoot("bench/toolbox/upload-probe");
const args = process.argv.slice(2).filter((a, i, all) => !a.startsWith("--") && all[i - 1] !== "--bundle");
const MIB_N = Number(args[0] ?? 256) || 256;
const ROUNDS = Number(args[1] ?? 3) || 3;
const TRACE = process.argv.includes("--trace");
/** --dio-ab: the loop device's direct I/O switched off and on between rounds (A/B on one sandbox). */
const DIO_AB = process.argv.includes("--dio-ab");
const MIB = 2 ** 20;

/** Different bytes per MiB (so a misplaced chunk changes the hash), made once. */
const CHUNKS = Array.from({ length: 16 }, () => randomBytes(MIB));
const chunkAt = (i: number) => CHUNKS[i % CHUNKS.length];
function expectedHash(mib: number): string {
  const h = createHash("sha256");
  for (let i = 0; i < mib; i++) h.update(chunkAt(i));
  return h.digest("hex");
}

async function memInfo(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const line of (await readFile("/proc/meminfo", "utf8")).split("\n")) {
    const m = /^(\w+):\s+(\d+)/.exec(line);
    if (m) out[m[1]] = Number(m[2]) * 1024;
  }
  return out;
}

async function memcgStat(dir: string | undefined): Promise<Record<string, number>> {
  if (!dir) return {};
  const out: Record<string, number> = {};
  for (const line of (await readFile(path.join(dir, "memory.stat"), "utf8")).split("\n")) {
    const [k, v] = line.split(" ");
    // total_*: the cgroup and its children (the agent runs in a child).
    if (k?.startsWith("total_")) out[k.slice(6)] = Number(v);
  }
  return out;
}

/** Wait channels of every thread of the processes in the cgroup, counted. */
async function waits(pids: number[]): Promise<string> {
  const seen = new Map<string, number>();
  for (const pid of pids) {
    for (const tid of await readdir(`/proc/${pid}/task`).catch(() => [])) {
      const w = (await readFile(`/proc/${pid}/task/${tid}/wchan`, "utf8").catch(() => "")).trim();
      const st = (await readFile(`/proc/${pid}/task/${tid}/stat`, "utf8").catch(() => "")).split(") ")[1]?.[0] ?? "?";
      if (w && w !== "0") seen.set(`${st}:${w}`, (seen.get(`${st}:${w}`) ?? 0) + 1);
    }
  }
  return [...seen].map(([k, n]) => `${k}×${n}`).join(" ");
}

const mb = (b: number) => (b / 1e6).toFixed(0);

async function restUpload(base: string, key: string, id: string, dest: string, mib: number): Promise<void> {
  await bulkUpload({ url: base, key, sandboxId: id, dest, mib, chunk: chunkAt });
}

/** Agent direct, in messages of `piece` bytes (control sends 256 KiB; run.ts's floor sent 1 MiB). */
async function agentUpload(dial: AgentDial, secret: string, dest: string, mib: number, piece = MIB): Promise<void> {
  const agents = new AgentClients();
  const files = agents.client(FileService, dial);
  async function* parts() {
    yield { part: { case: "header" as const, value: { path: dest } } };
    for (let i = 0; i < mib; i++) for (let at = 0; at < MIB; at += piece) yield { part: { case: "data" as const, value: chunkAt(i).subarray(at, at + piece) } };
  }
  const r = await files.uploadFile(parts(), { headers: { authorization: `Bearer ${secret}` } });
  agents.close();
  if (Number(r.file?.bytes) !== mib * MIB) throw new Error(`agent upload stored ${r.file?.bytes} bytes`);
}

function restHash(base: string, key: string, id: string, file: string): Promise<string> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const h = createHash("sha256");
    http
      .get({ host: url.hostname, port: url.port, path: `/api/toolbox/${id}/toolbox/files/download?path=${encodeURIComponent(file)}`, headers: { authorization: `Bearer ${key}` } }, (res) => {
        if (res.statusCode !== 200) return reject(new Error(`download answered ${res.statusCode}`));
        res.on("data", (c: Buffer) => h.update(c));
        res.on("end", () => resolve(h.digest("hex")));
        res.on("error", reject);
      })
      .on("error", reject);
  });
}

// --bundle <dir>: this agent bundle instead of one built from the worktree (to compare agents).
const bundleAt = process.argv.indexOf("--bundle");
const s = await startBenchServer(bundleAt > 0 ? { agentBundle: process.argv[bundleAt + 1] } : {});
try {
  const sb = await s.rest.ok("POST", "/sandbox", { disk: 5 });
  const dial = await s.server.server.sandboxes.manager.agentFor(sb.organizationId, sb.id);
  const home = (await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: 'printf %s "$HOME"' })).result as string;
  const memcg = await sandboxCgroup("/sys/fs/cgroup/memory", sb.id);
  // The sandbox's loop device: the mount whose mount point names the sandbox.
  const mi = (await readFile("/proc/self/mountinfo", "utf8")).split("\n").find((l) => l.includes(sb.id) && / - ext4 \/dev\/loop/.test(l));
  const loop = mi ? /\/dev\/(loop\d+)/.exec(mi)![1] : undefined;
  if (loop) {
    const sys = `/sys/block/${loop}`;
    const q = async (f: string) => (await readFile(path.join(sys, f), "utf8").catch(() => "?")).trim();
    console.log(
      `${loop}: dio=${await q("loop/dio")} backing=${await q("loop/backing_file")} sched=${await q("queue/scheduler")} max_sectors_kb=${await q("queue/max_sectors_kb")} nr_requests=${await q("queue/nr_requests")} logical_block=${await q("queue/logical_block_size")}`,
    );
    console.log(`mount: ${mi!.split(" - ")[0].split(" ").slice(4, 6).join(" ")} ${mi!.split(" - ")[1]}`);
  }
  if (memcg) console.log(`memcg ${memcg}: limit ${mb(Number(await readFile(path.join(memcg, "memory.limit_in_bytes"), "utf8")))} MB`);
  const procs = async (dir: string): Promise<number[]> => {
    const own = (await readFile(path.join(dir, "cgroup.procs"), "utf8").catch(() => "")).split("\n").filter(Boolean).map(Number);
    for (const e of await readdir(dir, { withFileTypes: true })) if (e.isDirectory()) own.push(...(await procs(path.join(dir, e.name))));
    return own;
  };
  const pids = memcg ? () => procs(memcg) : async () => [];
  const failcnt = async () => (memcg ? Number(await readFile(path.join(memcg, "memory.failcnt"), "utf8")) : NaN);
  const want = expectedHash(MIB_N);

  let sampling = true;
  const peaks = { dirty: 0, wb: 0, cgDirty: 0, cgWb: 0, cgCache: 0 };
  const t00 = performance.now();
  const sampler = (async () => {
    while (sampling) {
      const m = await memInfo();
      const c = await memcgStat(memcg);
      peaks.dirty = Math.max(peaks.dirty, m.Dirty);
      peaks.wb = Math.max(peaks.wb, m.Writeback);
      peaks.cgDirty = Math.max(peaks.cgDirty, c.dirty ?? 0);
      peaks.cgWb = Math.max(peaks.cgWb, c.writeback ?? 0);
      peaks.cgCache = Math.max(peaks.cgCache, c.cache ?? 0);
      if (TRACE) {
        console.log(
          `  t=${((performance.now() - t00) / 1000).toFixed(1)}s Dirty ${mb(m.Dirty)} WB ${mb(m.Writeback)} | cg dirty ${mb(c.dirty ?? 0)} wb ${mb(c.writeback ?? 0)} cache ${mb(c.cache ?? 0)} | ${await waits(await pids())}`,
        );
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  const kinds: [string, (dest: string) => Promise<void>][] = [
    ["REST", (dest) => restUpload(s.url, s.key, sb.id, dest, MIB_N)],
    ["agent", (dest) => agentUpload(dial, dial.secret, dest, MIB_N)],
    // --pieces: also agent direct in control's 256 KiB messages.
    ...(process.argv.includes("--pieces") ? [["agent256K", (dest: string) => agentUpload(dial, dial.secret, dest, MIB_N, 256 * 1024)] as [string, (dest: string) => Promise<void>]] : []),
  ];
  const rates: Record<string, string[]> = Object.fromEntries(kinds.map(([k]) => [k, []]));
  const cpu0 = process.cpuUsage();
  for (let round = 0; round < ROUNDS; round++) {
    if (DIO_AB && loop) {
      execFileSync("losetup", [`--direct-io=${round % 2 ? "on" : "off"}`, `/dev/${loop}`]);
      console.log(`round ${round}: ${loop} dio=${(await readFile(`/sys/block/${loop}/loop/dio`, "utf8")).trim()}`);
    }
    for (const [kind, up] of kinds) {
      const dest = `${home}/${kind}-${round}.bin`;
      for (const k of Object.keys(peaks) as (keyof typeof peaks)[]) peaks[k] = 0;
      if (TRACE) console.log(`${kind} upload ${round} starts at ${((performance.now() - t00) / 1000).toFixed(1)}s`);
      const f0 = await failcnt();
      const t0 = performance.now();
      await up(dest);
      const secs = (performance.now() - t0) / 1000;
      const rate = (MIB_N * MIB) / 1e6 / secs;
      rates[kind].push(rate.toFixed(0));
      console.log(
        `${kind.padEnd(9)} upload ${MIB_N} MiB round ${round}: ${rate.toFixed(0)} MB/s  peaks: Dirty ${mb(peaks.dirty)} WB ${mb(peaks.wb)} MB; cgroup dirty ${mb(peaks.cgDirty)} wb ${mb(peaks.cgWb)} cache ${mb(peaks.cgCache)} MB; limit hits ${(await failcnt()) - f0}`,
      );
    }
  }
  sampling = false;
  await sampler;
  // Every file read back and compared (not timed).
  for (let round = 0; round < ROUNDS; round++) {
    for (const [kind] of kinds) {
      const got = await restHash(s.url, s.key, sb.id, `${home}/${kind}-${round}.bin`);
      if (got !== want) throw new Error(`${kind}-${round}.bin read back with sha256 ${got}, sent ${want}`);
    }
  }
  console.log(`read back: ${ROUNDS * kinds.length} files, sha256 equal to what was sent`);
  const cpu = process.cpuUsage(cpu0);
  console.log(`control+client cpu over the uploads: ${((cpu.user + cpu.system) / 1e6).toFixed(2)} s`);
  console.log(`summary ${MIB_N} MiB: ${Object.entries(rates).map(([k, v]) => `${k} ${v.join(", ")}`).join("; ")} MB/s`);
  await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
} finally {
  await s.stop();
  log(`load average ${loadAvg()}`);
}
