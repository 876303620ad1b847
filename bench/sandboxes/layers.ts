// Layers bench: POST /sandbox/{id}/snapshot of a running sandbox whose writable layer holds 10 MB,
// 1 GiB and 10,000 small files, and POST /sandbox/{id}/fork (one) and /forks (ten sharing one
// capture), beside floors measured in the same run on the same sandbox: a bare freeze+thaw of its
// cgroup, and `cp -a --reflink=auto` of its upper dir (what a capture copies on this ext4 host).
//
//   node bench/sandboxes/layers.ts [--quick]     (as root; writes bench/sandboxes/RESULTS-layers.md)
import { spawnSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { loadAvg, log, machine, ms, requireRoot, startBenchServer, stats, type Stat } from "./support.ts";

requireRoot("bench/sandboxes/layers");
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
const scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-bench-layers-"));
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
  for (const c of cases) {
    const sb = await s.rest.ok("POST", "/sandbox", { disk: 10 });
    await exec(sb.id, c.fill);
    const upper = provider.layout.upper(sb.id, true);
    const freeze: number[] = [];
    const copy: number[] = [];
    const snap: number[] = [];
    for (let i = 0; i < c.runs; i++) {
      freeze.push(await timed(async () => {
        await provider.cgroups.freeze(sb.id);
        await provider.cgroups.thaw(sb.id);
      }));
      const dest = path.join(scratch, `copy-${n++}`);
      await rm(dest, { recursive: true, force: true });
      spawnSync("mkdir", [dest]);
      copy.push(await timed(async () => {
        const r = spawnSync("cp", ["-a", "--reflink=auto", "--", `${upper}/.`, `${dest}/`]);
        if (r.status !== 0) throw new Error(`cp: ${r.stderr.toString()}`);
      }));
      await rm(dest, { recursive: true, force: true });
      snap.push(await timed(() => s.rest.ok("POST", `/sandbox/${sb.id}/snapshot`, { name: `bench-${n++}` })));
    }
    record("floor: freeze+thaw", c.size, freeze);
    record("floor: cp -a of the upper", c.size, copy);
    record("createSnapshot", c.size, snap);
    if (c.size === "10 MB") {
      const one: number[] = [];
      const ten: number[] = [];
      for (let i = 0; i < (QUICK ? 2 : 5); i++) {
        const f = await timed(async () => {
          const forked = await s.rest.ok("POST", `/sandbox/${sb.id}/fork`, {});
          if (forked.state !== "started") throw new Error(`fork: ${JSON.stringify(forked)}`);
        });
        one.push(f);
        ten.push(await timed(async () => {
          const forks = await s.rest.ok("POST", `/sandbox/${sb.id}/forks`, { count: 10 });
          if (forks.length !== 10) throw new Error(`forks: ${JSON.stringify(forks)}`);
        }));
      }
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

Command: \`node bench/sandboxes/layers.ts\` (as root). One real control server, the default snapshot,
sandboxes with a 10 GiB disk cap (their writable layer on a loop-mounted ext4 image), filled through
the toolbox before the runs. For each size, interleaved per run:

- **floor: freeze+thaw**: the sandbox's cgroup frozen and thawed (cgroup freezer), nothing else.
- **floor: cp -a of the upper**: \`cp -a --reflink=auto\` of the sandbox's upper dir to the host's
  disk: what a capture copies (ext4 here: bytes are copied; on XFS/btrfs reflink shares them).
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
await writeFile(path.join(import.meta.dirname, "RESULTS-layers.md"), text);
log("wrote bench/sandboxes/RESULTS-layers.md");
