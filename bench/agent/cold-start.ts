// Where a cold start goes: sequential cold create→exec through REST, with the linux provider's
// phases, the agent's own ready line (readyMs: node's uptime when it listened; cpuMs) and the
// first exec. Printed; writes nothing.
//   node bench/agent/cold-start.ts [--runs N] [--bundle <agent bundle dir>]   (as root)
//   node bench/agent/cold-start.ts --ab <other checkout> [--runs N]
//     the same, interleaved run by run with another checkout of this repository (its own server,
//     runner and freshly built agent, in a child process): an A/B of everything on a cold start's
//     path, for changes outside the agent bundle too (`bench/sandboxes/run.ts --agent-ab` varies
//     the bundle only). The other checkout needs its dependencies (a node_modules).
//   node bench/agent/cold-start.ts --serve   (used by --ab: one run per line read, JSON out)
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import type { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { loadAvg, log, ms, requireRoot, startBenchServer, stats } from "../sandboxes/support.ts";

requireRoot("bench/agent/cold-start");
const { values } = parseArgs({ options: { runs: { type: "string", default: "15" }, bundle: { type: "string" }, ab: { type: "string" }, serve: { type: "boolean" } } });
const RUNS = Number(values.runs);
const WARM_UP = 2;

type Run = Record<string, number>;

/** One cold create→exec on a server, its figures by name. */
async function once(s: Awaited<ReturnType<typeof startBenchServer>>): Promise<Run> {
  const provider = (s.server.server.sandboxes.runtime as LocalRuntime).provider;
  const run: Run = {};
  provider.trace = (_id, phase, t) => void (run[`  phase ${phase}`] = t);
  try {
    const t0 = performance.now();
    const sb = await s.rest.ok("POST", "/sandbox", { memory: 2 });
    const t1 = performance.now();
    const r = await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
    const t2 = performance.now();
    if (r.exitCode !== 0) throw new Error(`exec exited ${r.exitCode}: ${r.result}`);
    const ready = (await readFile(provider.layout.initLog(sb.id), "utf8")).split("\n").find((l) => l.includes('"ready"'));
    // The agent's private memory right after its first exec (the largest process of its leaf).
    let anon = 0;
    for (const pid of await provider.cgroups.agentPids(sb.id)) {
      const kb = /RssAnon:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, "utf8").catch(() => ""))?.[1];
      anon = Math.max(anon, Number(kb ?? 0) / 1024);
    }
    run["  agent RssAnon MiB"] = anon;
    await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
    Object.assign(run, { "create→exec": t2 - t0, "  create": t1 - t0, "  1st exec": t2 - t1 });
    if (ready) {
      const j = JSON.parse(ready) as { readyMs: number; cpuMs: number };
      Object.assign(run, { "  agent readyMs": j.readyMs, "  agent cpuMs": j.cpuMs });
    }
    return run;
  } finally {
    provider.trace = () => undefined;
  }
}

function print(name: string, runs: Run[]): void {
  const keys = [...new Set(runs.flatMap((r) => Object.keys(r)))];
  for (const k of keys) {
    const st = stats(runs.map((r) => r[k]).filter((x): x is number => x !== undefined));
    console.log(`${name}${k.padEnd(22)} n=${st.n} p50=${ms(st.p50)} p95=${ms(st.p95)} mean=${ms(st.mean)}`);
  }
}

const server = () => startBenchServer({ warmPool: 0, ...(values.bundle ? { agentBundle: path.resolve(values.bundle) } : {}) });

if (values.serve) {
  const s = await server();
  try {
    process.stdout.write("ready\n");
    for await (const _ of createInterface({ input: process.stdin })) process.stdout.write(JSON.stringify(await once(s)) + "\n");
  } finally {
    await s.stop();
  }
} else if (values.ab) {
  const other = path.resolve(values.ab);
  const children = [
    { name: "this", cwd: process.cwd() },
    { name: "other", cwd: other },
  ].map(({ name, cwd }) => {
    const child = spawn(process.execPath, [path.join(cwd, "bench/agent/cold-start.ts"), "--serve"], { cwd, stdio: ["pipe", "pipe", "inherit"] });
    const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    const next = async () => {
      const l = await lines.next();
      if (l.done) throw new Error(`${name} (${cwd}) ended`);
      return l.value as string;
    };
    return { name, cwd, child, next, runs: [] as Run[] };
  });
  try {
    for (const c of children) if ((await c.next()) !== "ready") throw new Error(`${c.name} did not start`);
    log(`this checkout against ${other}, ${RUNS} runs each, interleaved (order alternating)`);
    for (let i = -WARM_UP; i < RUNS; i++) {
      for (const c of i % 2 ? [...children].reverse() : children) {
        c.child.stdin!.write("run\n");
        const run = JSON.parse(await c.next()) as Run;
        if (i >= 0) c.runs.push(run);
      }
    }
    for (const c of children) print(`${c.name.padEnd(6)}`, c.runs);
    // Runs i of both were next to each other in time: the median of their differences is less
    // moved by the load of the moment than the difference of the medians.
    const [a, b] = children as [(typeof children)[0], (typeof children)[0]];
    for (const k of Object.keys(a.runs[0] ?? {})) {
      const d = a.runs.map((r, i) => (r[k] ?? NaN) - (b.runs[i]?.[k] ?? NaN)).filter((x) => !Number.isNaN(x));
      console.log(`this - other, paired: ${k.trim().padEnd(16)} median ${ms(stats(d).p50)} ms`);
    }
    log(`load average ${loadAvg()}`);
  } finally {
    for (const c of children) c.child.stdin!.end();
    await Promise.all(children.map((c) => new Promise((r) => (c.child.exitCode !== null ? r(null) : c.child.once("exit", r)))));
  }
} else {
  const s = await server();
  try {
    const runs: Run[] = [];
    for (let i = -WARM_UP; i < RUNS; i++) {
      const run = await once(s);
      if (i >= 0) runs.push(run);
    }
    print("", runs);
    log(`load average ${loadAvg()}`);
  } finally {
    await s.stop();
  }
}
