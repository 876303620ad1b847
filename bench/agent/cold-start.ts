// Where a cold start's agent part goes: sequential cold create→exec through REST, with the linux
// provider's phases, the agent's own ready line (readyMs: node's uptime when it listened, cpuMs)
// and the first exec. Printed; writes nothing.
//   node bench/agent/cold-start.ts [--runs N] [--bundle <agent bundle dir>]   (as root)
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { parseArgs } from "node:util";
import type { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { loadAvg, log, ms, requireRoot, startBenchServer, stats } from "../sandboxes/support.ts";

requireRoot("bench/agent/cold-start");
const { values } = parseArgs({ options: { runs: { type: "string", default: "15" }, bundle: { type: "string" } } });
const RUNS = Number(values.runs);

const s = await startBenchServer({ warmPool: 0, ...(values.bundle ? { agentBundle: path.resolve(values.bundle) } : {}) });
const provider = (s.server.server.sandboxes.runtime as LocalRuntime).provider;
const series = new Map<string, number[]>();
const add = (k: string, v: number) => void (series.get(k) ?? series.set(k, []).get(k)!).push(v);
try {
  for (let i = -2; i < RUNS; i++) {
    const phases: [string, number][] = [];
    provider.trace = (_id, phase, t) => void phases.push([phase, t]);
    const t0 = performance.now();
    const sb = await s.rest.ok("POST", "/sandbox", { memory: 2 });
    const t1 = performance.now();
    const r = await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
    const t2 = performance.now();
    // What a start did after the socket accepted until launch() set the score (for the record):
    // the agent leaf's pids read, then each one's score written.
    const t3 = performance.now();
    for (const pid of await provider.cgroups.agentPids(sb.id)) await writeFile(`/proc/${pid}/oom_score_adj`, "-1000").catch(() => undefined);
    const oomStep = performance.now() - t3;
    if (r.exitCode !== 0) throw new Error(`exec exited ${r.exitCode}: ${r.result}`);
    const ready = (await readFile(provider.layout.initLog(sb.id), "utf8")).split("\n").find((l) => l.includes('"ready"'));
    await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
    if (i < 0) continue; // warm-up
    add("create→exec", t2 - t0);
    add("  create", t1 - t0);
    add("  1st exec", t2 - t1);
    add("  (old OOM step)", oomStep);
    for (const [p, t] of phases) add(`  phase ${p}`, t);
    if (ready) {
      const j = JSON.parse(ready) as { readyMs: number; cpuMs: number };
      add("  agent readyMs", j.readyMs);
      add("  agent cpuMs", j.cpuMs);
    }
  }
  for (const [k, xs] of series) {
    const st = stats(xs);
    console.log(`${k.padEnd(22)} n=${st.n} p50=${ms(st.p50)} p95=${ms(st.p95)} mean=${ms(st.mean)}`);
  }
  log(`load average ${loadAvg()}`);
} finally {
  provider.trace = () => undefined;
  await s.stop();
}
