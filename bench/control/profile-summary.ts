/**
 * Where the time goes in a V8 CPU profile (.cpuprofile, as `node --cpu-prof` writes):
 * self time by area (our packages by folder, dependencies by package, Node internals, GC)
 * and the functions with the most self and inclusive time. --from/--to (seconds since the
 * profile started) keep only a window, e.g. the measured load without the server's startup;
 * the busy share per second is printed to choose it.
 *
 *   node bench/control/profile-summary.ts <file.cpuprofile> [--top 25] [--from S] [--to S]
 */
import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

const { values, positionals } = parseArgs({
  options: { top: { type: "string", default: "25" }, from: { type: "string", default: "0" }, to: { type: "string", default: "Infinity" } },
  allowPositionals: true,
});
const top = Number(values.top);
const from = Number(values.from) * 1e6;
const to = Number(values.to) * 1e6;
if (positionals.length !== 1 || !Number.isInteger(top) || top < 1 || Number.isNaN(from) || Number.isNaN(to) || from >= to) {
  console.error("usage: node bench/control/profile-summary.ts <file.cpuprofile> [--top N] [--from S] [--to S]");
  if (positionals.length > 1) console.error(`give one profile file, got ${positionals.length} (the main thread's is the one ending .0.001.cpuprofile)`);
  process.exit(2);
}

const full = JSON.parse(await readFile(positionals[0], "utf8")) as Profile;
const byId = new Map(full.nodes.map((n) => [n.id, n]));
const parent = new Map<number, number>();
for (const n of full.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const idle = new Set(["(idle)", "(program)"]);

// Busy share per second over the whole profile, then only the samples inside the window.
const perSecond: { busy: number; all: number }[] = [];
const profile: Profile = { nodes: full.nodes, samples: [], timeDeltas: [] };
let clock = 0;
full.samples.forEach((id, i) => {
  const dt = full.timeDeltas[i] ?? 0;
  clock += dt;
  const slot = (perSecond[Math.floor(clock / 1e6)] ??= { busy: 0, all: 0 });
  slot.all += dt;
  if (!idle.has(byId.get(id)!.callFrame.functionName)) slot.busy += dt;
  if (clock >= from && clock < to) {
    profile.samples.push(id);
    profile.timeDeltas.push(dt);
  }
});
console.log(`busy % per second: ${perSecond.map((s, i) => `${i}:${s ? Math.round((s.busy / s.all) * 100) : 0}`).join(" ")}`);

// Self time per node, in microseconds (each sample's delta belongs to the node it hit).
const self = new Map<number, number>();
profile.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));

const busy = [...self].filter(([id]) => !idle.has(byId.get(id)!.callFrame.functionName)).reduce((a, [, t]) => a + t, 0);
const total = [...self.values()].reduce((a, b) => a + b, 0);

const keyOf = (n: ProfileNode) => `${n.callFrame.functionName || "(anonymous)"} ${shortUrl(n.callFrame.url)}${n.callFrame.url ? `:${n.callFrame.lineNumber + 1}` : ""}`;

// Self time grouped by area and by function.
const byArea = new Map<string, number>();
const selfByFn = new Map<string, number>();
for (const [id, t] of self) {
  const n = byId.get(id)!;
  if (idle.has(n.callFrame.functionName)) continue;
  add(byArea, areaOf(n), t);
  add(selfByFn, keyOf(n), t);
}

// Inclusive time by function: each sample counts once per distinct function on its stack.
const inclusive = new Map<string, number>();
profile.samples.forEach((id, i) => {
  if (idle.has(byId.get(id)!.callFrame.functionName)) return;
  const seen = new Set<string>();
  for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
    const key = keyOf(byId.get(cur)!);
    if (key.startsWith("(root)") || seen.has(key)) continue;
    seen.add(key);
    add(inclusive, key, profile.timeDeltas[i] ?? 0);
  }
});

console.log(`profile: ${(total / 1e6).toFixed(1)} s sampled, ${(busy / 1e6).toFixed(1)} s busy (${((busy / total) * 100).toFixed(0)}%); shares below are of busy time\n`);
print("self time by area", byArea, top);
print("self time by function", selfByFn, top);
print("inclusive time by function", inclusive, top);

function print(title: string, m: Map<string, number>, n: number): void {
  console.log(`## ${title}`);
  for (const [k, t] of [...m].sort((a, b) => b[1] - a[1]).slice(0, n)) {
    console.log(`${((t / busy) * 100).toFixed(1).padStart(5)}%  ${(t / 1000).toFixed(0).padStart(7)} ms  ${k}`);
  }
  console.log("");
}

function add(m: Map<string, number>, k: string, t: number): void {
  m.set(k, (m.get(k) ?? 0) + t);
}

function areaOf(n: ProfileNode): string {
  const { url, functionName } = n.callFrame;
  if (!url) return functionName.startsWith("(") ? functionName : "(native/builtin)";
  const dep = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (dep) return dep[1];
  const own = /\/packages\/([^/]+)\/(?:src\/)?([^/]+)/.exec(url);
  if (own) return `sandbar ${own[1]}/${own[2]}`;
  if (url.startsWith("node:")) return `node:${url.slice(5).split("/")[0]}`;
  return shortUrl(url);
}

function shortUrl(url: string): string {
  return url.replace(/^file:\/\//, "").replace(/^.*\/node_modules\//, "").replace(/^.*\/(packages|bench)\//, "$1/");
}
