// Layers bench: POST /sandbox/{id}/snapshot of a running sandbox whose writable layer holds 10 MB,
// 1 GiB and 10,000 small files, and POST /sandbox/{id}/fork (one) and /forks (ten sharing one
// capture), beside floors measured in the same run on the same sandbox: a bare freeze+thaw of its
// cgroup, and `cp -a --reflink=auto` of its upper dir (what a capture copies on this ext4 host).
//
//   node bench/sandboxes/run-layers.ts [--quick]     (as root; writes bench/sandboxes/RESULTS-layers.md)
//   node bench/sandboxes/run-layers.ts --fork-only   (the 10 MB case with the fork rows alone; printed, writes nothing)
import { spawnSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import type { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { loadAvg, log, machine, ms, requireRoot, startBenchServer, stats, type Stat } from "./support.ts";

requireRoot("bench/sandboxes/run-layers");
const QUICK = process.argv.includes("--quick");

interface Row {
  what: string;
  size: string;
  runs: number;
  s: Stat;
}
const rows: Row[] = [];
const record = (what: string, size: string, xs: number[]) => {
  const s = stats(xs);
  rows.push({ what, size, runs: xs.length, s });
  log(`${what} (${size}): p50 ${ms(s.p50)} ms, p95 ${ms(s.p95)} ms over ${xs.length}`);
};

const s = await startBenchServer();
const runtime = s.server.server.sandboxes.runtime as LocalRuntime;
const provider = runtime.provider;
// On the runner's own file system, where layers are made.
const scratch = await mkdtemp(path.join(provider.layout.dataDir, "bench-layers-"));
let n = 0;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

async function exec(id: string, command: string): Promise<void> {
  const r = await s.rest.ok("POST", `/toolbox/${id}/toolbox/process/execute`, { command, timeout: 600 });
  if (r.exitCode !== 0) throw new Error(`${command}: ${JSON.stringify(r)}`);
}

try {
  const cases: Array<{ size: string; fill: string; runs: number }> = [
    { size: "10 MB", fill: "head -c 10000000 /dev/urandom > ~/data", runs: QUICK ? 3 : 10 },
    { size: "10,000 files", fill: "mkdir -p ~/many && cd ~/many && i=0; while [ $i -lt 10000 ]; do echo $i > f$i; i=$((i+1)); done", runs: QUICK ? 2 : 5 },
    { size: "1 GiB", fill: "for i in $(seq 1 16); do head -c 67108864 /dev/urandom > ~/big$i; done", runs: QUICK ? 1 : 3 },
  ];
  for (const c of process.argv.includes("--fork-only") ? cases.slice(0, 1) : cases) {
    const sb = await s.rest.ok("POST", "/sandbox", {});
    await exec(sb.id, c.fill);
    const upper = provider.layout.upper(sb.id, true);
    const freeze: number[] = [];
    const copy: number[] = [];
    const snap: number[] = [];
    const copyOnce = async () => {
      const dest = path.join(scratch, `copy-${n++}`);
      spawnSync("mkdir", [dest]);
      spawnSync("sync");
      const t = await timed(async () => {
        const r = spawnSync("cp", ["-a", "--reflink=auto", "--", `${upper}/.`, `${dest}/`]);
        if (r.status !== 0) throw new Error(`cp: ${r.stderr.toString()}`);
      });
      await rm(dest, { recursive: true, force: true });
      return t;
    };
    const snapOnce = async () => {
      spawnSync("sync");
      return timed(() => s.rest.ok("POST", `/sandbox/${sb.id}/snapshot`, { name: `bench-${n++}` }));
    };
    await copyOnce(); // untimed: the upper's pages read once, as for every run after
    for (let i = 0; i < c.runs; i++) {
      freeze.push(await timed(async () => {
        await provider.cgroups.freeze(sb.id);
        await provider.cgroups.thaw(sb.id);
      }));
      // Alternated, so neither always follows the other's writeback.
      if (i % 2 === 0) {
        copy.push(await copyOnce());
        snap.push(await snapOnce());
      } else {
        snap.push(await snapOnce());
        copy.push(await copyOnce());
      }
    }
    record("floor: freeze+thaw", c.size, freeze);
    record("floor: cp -a of the upper", c.size, copy);
    record("createSnapshot", c.size, snap);
    if (c.size === "10 MB") {
      // Where a fork's time goes: the capture alone (runtime call), and the new sandbox's start phases.
      const captureOnly: number[] = [];
      for (let i = 0; i < (QUICK ? 2 : 5); i++) captureOnly.push(await timed(() => runtime.captureLayer(sb.id, `benchcap${n++}`)));
      record("captureLayer alone (runtime)", c.size, captureOnly);
      let phases = new Map<string, number[]>();
      provider.trace = (_id, phase, t) => void (phases.get(phase) ?? phases.set(phase, []).get(phase)!).push(t);
      const one: number[] = [];
      const ten: number[] = [];
      const cold: number[] = [];
      const onePhases = new Map<string, number[]>();
      for (let i = 0; i < (QUICK ? 2 : 5); i++) {
        // The same shape made from the default snapshot: what a fork adds to a create.
        cold.push(await timed(() => s.rest.ok("POST", "/sandbox", { memory: 2 })));
        phases = onePhases;
        const f = await timed(async () => {
          const forked = await s.rest.ok("POST", `/sandbox/${sb.id}/fork`, {});
          if (forked.state !== "started") throw new Error(`fork: ${JSON.stringify(forked)}`);
        });
        phases = new Map();
        one.push(f);
        ten.push(await timed(async () => {
          const forks = await s.rest.ok("POST", `/sandbox/${sb.id}/forks`, { count: 10 });
          if (forks.length !== 10) throw new Error(`forks: ${JSON.stringify(forks)}`);
        }));
      }
      provider.trace = () => undefined;
      for (const [phase, xs] of onePhases) log(`  one fork's start, phase ${phase}: p50 ${ms(stats(xs).p50)} ms`);
      record("create (default snapshot, cold)", "-", cold);
      record("fork (1, started)", c.size, one);
      record("forks (10 at once, started)", c.size, ten);
    }
  }
} finally {
  await s.stop();
  await rm(scratch, { recursive: true, force: true });
}

const table = rows.map((r) => `| ${r.what} | ${r.size} | ${r.runs} | ${ms(r.s.p50)} | ${ms(r.s.p95)} | ${ms(r.s.mean)} |`).join("\n");
const text = `# Sandboxes bench: snapshots of running sandboxes and forks

Latest run: ${new Date().toISOString()} on ${machine()}; load average at the end ${loadAvg()} (shared machine).

Command: \`node bench/sandboxes/run-layers.ts\` (as root). One real control server, the default snapshot,
sandboxes of the default shape (their writable layer on a loop-mounted 3 GiB ext4 image), filled through
the toolbox before the runs. For each size, interleaved per run:

- **floor: freeze+thaw**: the sandbox's cgroup frozen and thawed (cgroup freezer), nothing else.
- **floor: cp -a of the upper**: \`cp -a --reflink=auto\` of the sandbox's upper dir into the
  runner's data dir: what a capture copies (ext4 here: bytes are copied; on XFS/btrfs reflink shares
  them). \`sync\` (untimed) before it and before each createSnapshot; the two alternate.
- **createSnapshot**: \`POST /api/sandbox/{id}/snapshot {"name"}\`: rows, freeze, the copy, thaw, the
  snapshot active (each run stacks one more layer; past 8 the capture squashes the stack).
- **fork (1, started)**: \`POST /api/sandbox/{id}/fork\` until the fork is started (its answer).
- **forks (10 at once, started)**: \`POST /api/sandbox/{id}/forks {"count": 10}\`: one capture, ten forks started.

| what | size | runs | p50 ms | p95 ms | mean ms |
|---|---|---|---|---|---|
${table}

A capture costs a freeze and a copy of the writable layer: its time grows with the upper's size on
a file system without reflink (this host), not with the sandbox's history (layers stack; the depth
bound squashes). A fork adds a create on the captured stack; ten forks share one capture.
`;
if (process.argv.includes("--fork-only")) log("--fork-only: printed, nothing written");
else {
  await writeFile(path.join(import.meta.dirname, "RESULTS-layers.md"), text);
  log("wrote bench/sandboxes/RESULTS-layers.md");
}
