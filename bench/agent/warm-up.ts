/**
 * How an agent's calls get cheaper as it warms up, and what V8 flags change in that: the bundled
 * agent started as sandboxes start it (its startup snapshot, --use-openssl-ca, --preload), then
 * Execute("true") called CALLS times in a row over one connection; for each call its wall time
 * and the agent's main-thread CPU time (/proc/<pid>/schedstat, in ns: far less sensitive to the
 * neighbours' load than wall time). Modes are interleaved, rotated each round. Also: ready time
 * (spawn to ready line) and private memory (RssAnon) after the calls.
 *
 *   node bench/agent/warm-up.ts [rounds [calls]] [--flags "<v8 flags>"]...   (prints, writes nothing)
 *
 * Without --flags the modes are the sandboxes' start and the same with --always-sparkplug.
 * WARM_UP_CALLS (control/src/sandboxes/warm-pool.ts) is chosen from the per-call curve.
 */
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { buildAgent } from "../../packages/agent/build.ts";
import { snapshotBlobName } from "../../packages/agent/snapshot-blob.ts";
import { socketTransport } from "../../packages/agent/src/testing/agent-process.ts";

const here = path.dirname(fileURLToPath(import.meta.url));
const ROUNDS = Number(process.argv[2]) || 9;
const CALLS = Number(process.argv[3]) || 15;
const given = process.argv.flatMap((a, i) => (a === "--flags" ? [process.argv[i + 1] ?? ""] : []));
const MODES = given.length ? given : ["", "--always-sparkplug"];

const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const f = (x: number) => x.toFixed(2);

async function cpuNs(pid: number): Promise<number> {
  return Number((await readFile(`/proc/${pid}/schedstat`, "utf8")).split(" ")[0]);
}

async function anonMb(pid: number): Promise<number> {
  return Number(/RssAnon:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, "utf8"))![1]) / 1024;
}

async function once(bundle: string, dir: string, n: number, flags: string) {
  const socket = path.join(dir, `a-${n}.sock`);
  const secretFile = path.join(dir, "secret");
  await writeFile(secretFile, "bench-secret");
  const nodeArgs = ["--use-openssl-ca", "--snapshot-blob", path.join(path.dirname(bundle), snapshotBlobName()), ...flags.split(" ").filter(Boolean)];
  const t0 = performance.now();
  const child = spawn(process.execPath, [...nodeArgs, bundle, "--socket", socket, "--secret-file", secretFile, "--root", dir, "--state-dir", path.join(dir, `s-${n}`), "--preload"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d: Buffer) => d.includes(10) && resolve());
    child.once("exit", (code) => reject(new Error(`agent exited with ${code}`)));
  });
  const ready = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 300)); // --preload done, as a pool sandbox's first call finds it
  const pid = child.pid!;
  const client = createClient(ProcessService, socketTransport(socket, "bench-secret"));
  const wall: number[] = [];
  const cpu: number[] = [];
  const mem: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const c0 = await cpuNs(pid);
    const w0 = performance.now();
    await client.execute({ command: "true" });
    wall.push(performance.now() - w0);
    await new Promise((r) => setTimeout(r, 30)); // the spare shell replaced after the answer: not in the next call
    cpu.push((await cpuNs(pid)) - c0);
    mem.push(await anonMb(pid));
  }
  const anon = mem[mem.length - 1]!;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  await exited;
  return { ready, wall, cpu: cpu.map((ns) => ns / 1e6), anon, mem };
}

async function main() {
  const dir = await mkdtemp(path.join(tmpdir(), "agent-warm-up-"));
  const bundle = await buildAgent(path.join(here, "..", "..", "packages", "agent", "dist"));
  const r = new Map(MODES.map((m) => [m, [] as Awaited<ReturnType<typeof once>>[]]));
  let n = 0;
  try {
    for (let i = 0; i < ROUNDS; i++) {
      for (let k = 0; k < MODES.length; k++) {
        const mode = MODES[(k + i) % MODES.length]!;
        r.get(mode)!.push(await once(bundle, dir, n++, mode));
      }
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  for (const [mode, runs] of r) {
    console.log(`\n[${mode || "as sandboxes start"}] ${runs.length} agents: ready p50 ${f(p50(runs.map((x) => x.ready)))} ms, RssAnon after ${CALLS} calls p50 ${f(p50(runs.map((x) => x.anon)))} MB`);
    console.log("call  wall p50 ms  agent cpu p50 ms  RssAnon p50 MB");
    for (let c = 0; c < CALLS; c++) {
      const at = (k: "wall" | "cpu" | "mem") => f(p50(runs.map((x) => x[k][c]!)));
      console.log(`${String(c + 1).padStart(4)}  ${at("wall").padStart(11)}  ${at("cpu").padStart(16)}  ${at("mem").padStart(14)}`);
    }
  }
  console.log(`\nload average ${loadavg().map((l) => l.toFixed(2)).join(" / ")}`);
}

await main();
