// CPU and wall time per Execute("true") of two agent bundles, interleaved block by block, each
// agent in a cpuacct cgroup of its own with a user leaf under it as in a sandbox (`--user-cgroup`:
// the shells join it): CPU per call of the agent (node) and of its shells, beside the wall p50.
//
//   node bench/agent/exec-ab.ts <dist A> <dist B> [calls per block] [rounds] [--parallel n]
//     (as root; a dist is a directory holding agent.mjs, e.g. packages/agent/dist or a copy)
//
// Prints per-round figures and the medians over rounds; writes nothing but its temp dir.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import * as path from "node:path";
import { createClient } from "@connectrpc/connect";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { socketTransport } from "../../packages/agent/src/testing/agent-process.ts";

if (process.getuid?.() !== 0) throw new Error("bench/agent/exec-ab: run as root (cgroups)");
const args = process.argv.slice(2).filter((a, i, all) => !a.startsWith("--") && all[i - 1] !== "--parallel");
const [distA, distB] = args;
if (!distA || !distB) throw new Error("usage: exec-ab.ts <dist A> <dist B> [calls] [rounds] [--parallel n]");
const CALLS = Number(args[2] ?? 200);
const ROUNDS = Number(args[3] ?? 6);
const parAt = process.argv.indexOf("--parallel");
const PARALLEL = parAt > 0 ? Number(process.argv[parAt + 1]) : 1;
const CPUACCT = "/sys/fs/cgroup/cpuacct";

interface Agent {
  name: string;
  child: ChildProcess;
  cgroup: string;
  client: ReturnType<typeof createClient<typeof ProcessService>>;
}

const usage = (cg: string) => Number(readFileSync(path.join(cg, "cpuacct.usage"), "utf8")) / 1e6;

async function start(name: string, dist: string, dir: string): Promise<Agent> {
  const cgroup = path.join(CPUACCT, `sandbar-exec-ab-${process.pid}-${name}`);
  mkdirSync(path.join(cgroup, "user"), { recursive: true });
  // Each agent a directory of its own: it puts other sockets beside its own.
  dir = path.join(dir, name);
  mkdirSync(dir);
  const socket = path.join(dir, "agent.sock");
  const secretFile = path.join(dir, "secret");
  writeFileSync(secretFile, "bench-secret");
  const root = path.join(dir, `root-${name}`);
  mkdirSync(root);
  const node = [process.execPath, path.join(dist, "agent.mjs"), "--socket", socket, "--secret-file", secretFile, "--root", root, "--state-dir", path.join(dir, `state-${name}`), "--user-cgroup", path.join(cgroup, "user", "cgroup.procs")];
  const child = spawn("/bin/sh", ["-c", `echo $$ > ${cgroup}/cgroup.procs && exec "$@"`, "sh", ...node], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once("data", () => resolve());
    child.once("exit", (code) => reject(new Error(`agent ${name} exited with ${code}`)));
  });
  const client = createClient(ProcessService, socketTransport(socket, "bench-secret"));
  for (let i = 0; i < 100; i++) await client.execute({ command: "true" });
  return { name, child, cgroup, client };
}

async function block(a: Agent): Promise<{ p50: number; agentCpu: number; shellCpu: number }> {
  const times: number[] = [];
  const u0 = usage(a.cgroup);
  const s0 = usage(path.join(a.cgroup, "user"));
  let next = 0;
  await Promise.all(Array.from({ length: PARALLEL }, async () => {
    while (next++ < CALLS) {
      const t0 = performance.now();
      const r = await a.client.execute({ command: "true" });
      times.push(performance.now() - t0);
      if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
    }
  }));
  const total = usage(a.cgroup) - u0;
  const shell = usage(path.join(a.cgroup, "user")) - s0;
  times.sort((x, y) => x - y);
  return { p50: times[Math.floor(times.length / 2)]!, agentCpu: (total - shell) / CALLS, shellCpu: shell / CALLS };
}

const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
const dir = await mkdtemp(path.join(tmpdir(), "sandbar-exec-ab-"));
const agents: Agent[] = [];
process.on("exit", () => agents.forEach((a) => a.child.kill("SIGKILL")));
agents.push(await start("A", distA, dir));
agents.push(await start("B", distB, dir));
const results: Record<string, { p50: number; agentCpu: number; shellCpu: number }[]> = { A: [], B: [] };
const load0 = loadavg()[0];
try {
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? agents : [...agents].reverse();
    for (const a of order) results[a.name]!.push(await block(a));
    const line = agents.map((a) => {
      const x = results[a.name]!.at(-1)!;
      return `${a.name}: p50 ${x.p50.toFixed(3)} ms, CPU/call agent ${x.agentCpu.toFixed(3)} + shells ${x.shellCpu.toFixed(3)} = ${(x.agentCpu + x.shellCpu).toFixed(3)} ms`;
    });
    console.log(`round ${r + 1}: ${line.join(" | ")}`);
  }
  for (const a of agents) {
    const xs = results[a.name]!;
    console.log(`median ${a.name}: p50 ${median(xs.map((x) => x.p50)).toFixed(3)} ms, CPU/call agent ${median(xs.map((x) => x.agentCpu)).toFixed(3)}, shells ${median(xs.map((x) => x.shellCpu)).toFixed(3)}, total ${median(xs.map((x) => x.agentCpu + x.shellCpu)).toFixed(3)} ms`);
  }
  console.log(`${CALLS} calls per block, ${ROUNDS} rounds, parallel ${PARALLEL}, load average ${load0.toFixed(2)} -> ${loadavg()[0].toFixed(2)}`);
} finally {
  for (const a of agents) {
    const exited = new Promise((r) => a.child.once("exit", r));
    a.child.kill("SIGTERM");
    await exited;
  }
  await new Promise((r) => setTimeout(r, 200));
  for (const a of agents) {
    for (const cg of [path.join(a.cgroup, "user"), a.cgroup]) {
      try {
        for (const pid of readFileSync(path.join(cg, "cgroup.procs"), "utf8").split("\n").filter(Boolean)) process.kill(Number(pid), "SIGKILL");
        await new Promise((r) => setTimeout(r, 50));
        rmdirSync(cg);
      } catch (err) {
        console.error(`cleanup ${cg}: ${(err as Error).message}`);
      }
    }
  }
  await rm(dir, { recursive: true, force: true });
}
