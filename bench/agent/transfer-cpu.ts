// The agent's CPU per GiB moved by FileService.UploadFile / DownloadFile, for A/B work on the
// transfer path on a shared machine: the agent runs as a plain process (the bundle, as sandboxes
// run it, or the sources with --src) on a temporary directory, the control server's client of
// agents (AgentClients) in this process sends 256 KiB messages (what control sends) and reads the
// download, checked by SHA-256; the figures are the agent's own CPU (utime and stime from /proc/<pid>/stat: user space and the kernel work done on its behalf,
// e.g. copying into the page cache), per GiB, split by thread, and the wall-clock MB/s beside them.
//
//   node bench/agent/transfer-cpu.ts [MiB=256] [rounds=3] [--dist <dir>] [--src] [--up] [--profile <dir>]
//
// --up: uploads only.
// --dist: another build of the agent (e.g. a copy of packages/agent/dist from another commit),
// for interleaved A/B runs. --profile: the agent started with --cpu-prof into that directory.
// Prints only; every file it writes is removed.
import { createHash } from "node:crypto";
import { readdir, readFile, rm } from "node:fs/promises";
import * as path from "node:path";
import { connect } from "node:net";
import { fileURLToPath } from "node:url";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { startAgentProcess } from "../../packages/agent/src/testing/agent-process.ts";
import { AgentClients } from "../../packages/control/src/toolbox/agent-clients.ts";

const args = process.argv.slice(2);
const flag = (name: string) => {
  const at = args.indexOf(name);
  if (at < 0) return undefined;
  const v = args[at + 1];
  args.splice(at, 2);
  return v;
};
const DIST = flag("--dist") ?? fileURLToPath(new URL("../../packages/agent/dist", import.meta.url));
const PROFILE = flag("--profile");
const SRC = args.includes("--src");
const UP_ONLY = args.includes("--up");
const nums = args.filter((a) => !a.startsWith("--")).map(Number);
const MIB = nums[0] || 256;
const ROUNDS = nums[1] || 3;
const MiB = 2 ** 20;
const CHUNK = 256 * 1024;
const TICK = 100; // USER_HZ

const node = [process.execPath, ...(PROFILE ? ["--cpu-prof", `--cpu-prof-dir=${PROFILE}`] : [])];
const agent = await startAgentProcess({ command: [...node, SRC ? path.join(path.dirname(DIST), "src/main.ts") : path.join(DIST, "agent.mjs")] });
const pid = agent.child.pid!;
// BENCH_PERF=<file>: a `perf record -g` of the agent over the transfers (which native code, which thread).
const perf = process.env.BENCH_PERF
  ? (await import("node:child_process")).spawn("perf", ["record", "-F", "999", "-g", "-p", String(pid), "-o", process.env.BENCH_PERF], { stdio: "ignore" })
  : undefined;
if (perf) await new Promise((r) => setTimeout(r, 500));
async function cpu(): Promise<{ user: number; sys: number }> {
  const f = (await readFile(`/proc/${pid}/stat`, "utf8")).split(") ")[1].split(" ");
  return { user: Number(f[11]) / TICK, sys: Number(f[12]) / TICK };
}
/** CPU seconds of each of the agent's threads, by thread name (libuv's pool, V8's helpers, the main thread). */
async function threads(): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const tid of await readdir(`/proc/${pid}/task`)) {
    const stat = await readFile(`/proc/${pid}/task/${tid}/stat`, "utf8").catch(() => "");
    if (!stat) continue;
    const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")).replace(/\d+$/, "");
    const f = stat.split(") ")[1].split(" ");
    const key = tid === String(pid) ? "main" : name;
    out.set(key, (out.get(key) ?? 0) + (Number(f[11]) + Number(f[12])) / TICK);
  }
  return out;
}
const byThread = (a: Map<string, number>, b: Map<string, number>) =>
  [...b].map(([k, v]) => [k, (v - (a.get(k) ?? 0)) / gib] as const).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(", ");

// The control server's own client of agents (its HTTP/2 settings are what the agent serves in production).
const clients = new AgentClients();
const fs = clients.client(FileService, { key: agent.socketPath, api: () => connect(agent.socketPath) });
const auth = { headers: { authorization: `Bearer ${agent.secret}` } };
const file = path.join(agent.root, "up.bin");
const base = Buffer.alloc(CHUNK);
for (let i = 0; i < CHUNK; i++) base[i] = (i * 7) & 0xff;
const gib = MIB / 1024;
const fmt = (c0: { user: number; sys: number }, c1: { user: number; sys: number }) =>
  `user ${((c1.user - c0.user) / gib).toFixed(2)} sys ${((c1.sys - c0.sys) / gib).toFixed(2)} total ${((c1.user + c1.sys - c0.user - c0.sys) / gib).toFixed(2)} s/GiB`;
try {
  for (let round = 0; round < ROUNDS; round++) {
    const sent = createHash("sha256");
    async function* body() {
      yield { part: { case: "header" as const, value: { path: file } } };
      for (let n = 0; n < (MIB * MiB) / CHUNK; n++) {
        const chunk = Buffer.from(base);
        chunk.writeUInt32BE(n, 0);
        sent.update(chunk);
        yield { part: { case: "data" as const, value: chunk } };
      }
    }
    let th0 = await threads();
    let c0 = await cpu();
    let t0 = performance.now();
    const up = await fs.uploadFile(body(), auth);
    let secs = (performance.now() - t0) / 1000;
    let c1 = await cpu();
    let th1 = await threads();
    if (up.file?.bytes !== BigInt(MIB * MiB)) throw new Error(`uploaded ${up.file?.bytes} bytes`);
    console.log(`upload   ${MIB} MiB: ${((MIB * MiB) / 1e6 / secs).toFixed(0).padStart(5)} MB/s  agent cpu ${fmt(c0, c1)} (${byThread(th0, th1)})`);

    if (UP_ONLY) {
      await rm(file);
      continue;
    }
    const got = createHash("sha256");
    let bytes = 0;
    th0 = await threads();
    c0 = await cpu();
    t0 = performance.now();
    for await (const m of fs.downloadFile({ path: file }, auth)) {
      if (m.part.case !== "data") continue;
      got.update(m.part.value);
      bytes += m.part.value.length;
    }
    secs = (performance.now() - t0) / 1000;
    c1 = await cpu();
    th1 = await threads();
    if (bytes !== MIB * MiB || got.digest("hex") !== sent.digest("hex")) throw new Error("download differs from upload");
    console.log(`download ${MIB} MiB: ${((MIB * MiB) / 1e6 / secs).toFixed(0).padStart(5)} MB/s  agent cpu ${fmt(c0, c1)} (${byThread(th0, th1)})`);
    await rm(file);
  }
} finally {
  if (perf) {
    perf.kill("SIGINT");
    await new Promise((r) => perf.once("exit", r));
  }
  clients.close();
  await agent.stop();
}
