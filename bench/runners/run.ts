// bench/runners: what a runner process costs against the in-process runtime, same host, same run.
// - time to interactive: POST /sandbox (no warm pool) until the first execute answers;
// - exec round trip: POST /toolbox/{id}/toolbox/process/execute "true" on a started sandbox.
// Two control servers: one with its runtime in-process, one whose runtime is a `sandbar runner`
// process on loopback (h2c); rounds interleaved so load drifts hit both alike. Target: < 5 ms
// added at p50. Records bench/runners/RESULTS.md.
import { writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { startTestServer } from "../../packages/control/src/testing/server.ts";
import { startRunnerProcess } from "../../packages/control/src/runners/testing/runner-process.ts";
import { loadAvg, log, machine, ms, requireRoot, Rest, stats, type Stat } from "../sandboxes/support.ts";

requireRoot("bench/runners");
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 10);
const EXECS = 30;

const runner = await startRunnerProcess();
const local = await startTestServer();
const remote = await startTestServer({ settings: { remoteRunner: { url: runner.url, credential: runner.credential } } });
const paths = [
  { name: "in-process runtime", rest: new Rest(local.url, local.adminKey) },
  { name: "runner process (h2c, loopback)", rest: new Rest(remote.url, remote.adminKey) },
];
const tti: Record<string, number[]> = {};
const creates: Record<string, number[]> = {};
const firsts: Record<string, number[]> = {};
const exec: Record<string, number[]> = {};
try {
  log(`${machine()}; load ${loadAvg()}; ${ROUNDS} rounds`);
  for (let i = 0; i < ROUNDS; i++) {
    for (const p of i % 2 ? [...paths].reverse() : paths) {
      const t0 = performance.now();
      const sb = await p.rest.ok("POST", "/sandbox", { autoStopInterval: 0 });
      const t1 = performance.now();
      await p.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
      const t2 = performance.now();
      (tti[p.name] ??= []).push(t2 - t0);
      (creates[p.name] ??= []).push(t1 - t0);
      (firsts[p.name] ??= []).push(t2 - t1);
      for (let j = 0; j < EXECS; j++) {
        const e0 = performance.now();
        await p.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
        (exec[p.name] ??= []).push(performance.now() - e0);
      }
      await p.rest.ok("DELETE", `/sandbox/${sb.id}`);
    }
  }
} finally {
  for (const p of paths) p.rest.close();
  await remote.stop();
  await local.stop();
  await runner.stop();
}

const row = (what: string, s: Record<string, number[]>) => {
  const [a, b] = paths.map((p) => stats(s[p.name]!)) as [Stat, Stat];
  const added = b.p50 - a.p50;
  return `| ${what} | ${ms(a.p50)} / ${ms(a.p95)} ms | ${ms(b.p50)} / ${ms(b.p95)} ms | ${ms(added)} ms | < 5 ms: ${added < 5 ? "met" : "missed"} |`;
};
const table = [
  "| measure | in-process p50 / p95 | runner process p50 / p95 | added at p50 | target |",
  "|---|---|---|---|---|",
  row(`time to interactive (create → first exec), n=${ROUNDS}`, tti),
  row(`  of which create`, creates),
  row(`  of which first exec`, firsts),
  row(`exec round trip, n=${ROUNDS * EXECS}`, exec),
].join("\n");
console.log(table);
const results = `# bench/runners

\`node bench/runners/run.ts\` (root). ${machine()}; load at start ${loadAvg()}.

Two control servers in one process, one with the in-process runtime, one whose runtime is a
\`sandbar runner\` process on loopback (h2c); rounds interleaved. No warm pool.

${table}

The runner path adds, per call: control's gRPC call to the runner (create, start) and, for agent
traffic, a local unix-socket relay plus one HTTP/2 stream to the runner, which pipes it to the
agent's socket (see docs/runners.md).
`;
await writeFile(fileURLToPath(new URL("./RESULTS.md", import.meta.url)), results);
