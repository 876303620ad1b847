// The host's part of a cold create+start+destroy through LinuxProvider directly (no control plane,
// the test exec agent): per-phase medians from the provider's trace hook, plus `create` (the disk
// image), `start` and `destroy`. Usage: node bench/runner/host-phases.ts [runs=30] [diskGiB=3]
// A/B: BASE_SRC=<another checkout>/packages/runner/src/linux also loads that checkout's provider
// and alternates the two round by round (same machine, same moment: the machine is shared).
// `CPU ms per create+start+destroy`: this process, the processes it waited for, and the runner's
// spawner process with those it waited for (spawner.ts, where the checkout has one). The sandbox's
// own processes are the launcher's children: the stand-in agent's CPU is in it, alike both sides.
// Usage: [DISK_POOL=0] [BASE_SRC=...] node bench/runner/host-phases.ts [runs] [diskGiB]
// Far less moved by the neighbours' load than the wall times.
import { readFileSync } from "node:fs";
import { rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { stats } from "../sandboxes/support.ts";

type Harness = typeof import("../../packages/runner/src/linux/testing/harness.ts");
const runs = Number(process.argv[2] ?? 30);
const diskGiB = Number(process.argv[3] ?? 3);
const here = path.join(path.dirname(fileURLToPath(import.meta.url)), "../../packages/runner/src/linux");
const sources = [["this", here], ...(process.env.BASE_SRC ? [["base", process.env.BASE_SRC]] : [])] as const;

/** utime + stime (+ cutime + cstime: children waited for) of a process, in ms. */
function cpuOf(pid: number | "self"): number {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return [11, 12, 13, 14].reduce((sum, i) => sum + Number(f[i]), 0) * 10;
}

interface Side {
  name: string;
  /** The checkout's spawner process, if it has one. */
  spawnerPid: () => number | undefined;
  h: Harness;
  f: Awaited<ReturnType<Harness["fixture"]>>;
  times: Map<string, number[]>;
  add(k: string, ms: number): void;
  /** Sum of a start's traced phases, by sandbox. */
  phased: Map<string, number>;
}
const sides: Side[] = [];
for (const [name, src] of sources) {
  const h = (await import(path.join(src, "testing/harness.ts"))) as Harness;
  type SpawnerModule = { readySpawner(): Promise<{ pid?: number } | undefined> };
  const sp = (await import(path.join(src, "spawner.ts")).catch(() => undefined)) as SpawnerModule | undefined;
  const helper = await sp?.readySpawner();
  const spawnerPid = () => helper?.pid;
  // DISK_POOL=0: every create formats its own image (a pool's background mkfs would be counted in
  // whichever side's round reaps it).
  const f = await h.fixture(process.env.DISK_POOL === "0" ? { diskPool: { perSize: 0 } } : {});
  const times = new Map<string, number[]>();
  const add = (k: string, ms: number) => void (times.get(k) ?? times.set(k, []).get(k)!).push(ms);
  const host = new Map<string, number>();
  const phased = new Map<string, number>();
  f.provider.trace = (id, phase, ms) => {
    add(phase, ms);
    // The host's own part of a start: every phase but the wait for the agent's socket.
    if (phase !== "socket") host.set(id, (host.get(id) ?? 0) + ms);
    else add("host phases (start - socket)", host.get(id) ?? 0);
    phased.set(id, (phased.get(id) ?? 0) + ms);
  };
  sides.push({ name, spawnerPid, h, f, times, add, phased });
}

function cpuNow(s: Side): number {
  const pid = s.spawnerPid();
  let spawnerCpu = 0;
  try {
    spawnerCpu = pid ? cpuOf(pid) : 0;
  } catch {
    // gone (a new one would start): its part is lost for this round
  }
  return cpuOf("self") + spawnerCpu;
}

async function round(s: Side, prefix: string): Promise<void> {
  const id = s.h.uniqueId(prefix);
  const cpu0 = cpuNow(s);
  let t = performance.now();
  await s.f.provider.create(s.f.spec(id, diskGiB > 0 ? { diskGiB } : {}));
  s.add("create", performance.now() - t);
  const t1 = performance.now();
  await s.f.provider.start(id);
  s.add("start", performance.now() - t1);
  s.add("start after the phases (before cleanup, after socket)", performance.now() - t1 - (s.phased.get(id) ?? 0));
  s.add("create+start", performance.now() - t);
  t = performance.now();
  await s.f.provider.destroy(id);
  s.add("destroy", performance.now() - t);
  s.add("CPU ms per create+start+destroy (mean)", cpuNow(s) - cpu0);
}

for (const s of sides) {
  await round(s, "warm"); // the tools layer built, the page cache warm
  s.times.clear();
}
for (let i = 0; i < runs; i++) {
  for (const s of i % 2 ? [...sides].reverse() : sides) {
    await round(s, "cold");
    await new Promise((r) => setTimeout(r, 50)); // some idle time between creates, as a service has
  }
}
for (const s of sides) {
  await s.f.provider.close();
  await rm(s.f.dataDir, { recursive: true, force: true });
}
console.log(`${runs} rounds, diskGiB ${diskGiB}${sides.length > 1 ? ", alternating" : ""}`);
console.log(`| step | ${sides.map((s) => `${s.name} p50 | ${s.name} p95`).join(" | ")} |`);
for (const k of sides[0]!.times.keys()) {
  // CPU: 10 ms ticks, so the mean (the p50 of ticks would be 0 or 10).
  const fmt = (x: ReturnType<typeof stats>) => (k.startsWith("CPU") ? `${x.mean.toFixed(2)} | ` : `${x.p50.toFixed(2)} | ${x.p95.toFixed(2)}`);
  console.log(`| ${k} | ${sides.map((s) => fmt(stats(s.times.get(k) ?? [0]))).join(" | ")} |`);
}
