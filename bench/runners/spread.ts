// bench/runners/spread.ts: creates per second across two runner processes against one.
// One control server, a custom region with two registered `sandbar runner` processes (each in a
// network namespace of its own, reached over a veth pair, as in the scheduling tests). For each
// concurrency: N creates (POST /sandbox, no warm pool, answered started) with one runner
// schedulable (the other marked unschedulable), then the same N with both; creates/s, the ratio
// and how many sandboxes each runner got. Sandboxes are deleted between phases (not timed).
// `node bench/runners/spread.ts [--quick]` (root); the full run records bench/runners/SPREAD.md.
import { writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { freePort } from "@sandbar/runner/free-port";
import { startTestServer } from "../../packages/control/src/testing/server.ts";
import { type RunnerProcess, startRunnerProcess } from "../../packages/control/src/runners/testing/runner-process.ts";
import { createTestNetns, type TestNetns } from "../../packages/control/src/runners/testing/netns.ts";
import { loadAvg, log, machine, pool, requireRoot, Rest } from "../sandboxes/support.ts";

requireRoot("bench/runners/spread");
const quick = process.argv.includes("--quick");
const N = quick ? 8 : Number(process.env.BENCH_CREATES ?? 40);
const WIDTHS = quick ? [4] : [4, 8];
// Room for every sandbox of a phase on one runner: placement is not what limits the figures.
const CAPACITY = { SANDBAR_RUNNER_CPU: String(N), SANDBAR_RUNNER_MEMORY_GIB: String(N), SANDBAR_RUNNER_DISK_GIB: String(N * 3) };

const control = await startTestServer({ settings: { runnerChecks: { intervalMs: 500, unresponsiveMs: 10_000 } } });
const rest = new Rest(control.url, control.adminKey);
const namespaces: TestNetns[] = [];
const runners: Array<{ id: string; key: string; process: RunnerProcess }> = [];
const rows: string[] = [];
try {
  const region = (await rest.ok("POST", "/regions", { name: "bench-fleet" })).id as string;
  for (const [i, name] of ["runner-a", "runner-b"].entries()) {
    const netns = createTestNetns(i + 1);
    namespaces.push(netns);
    const port = await freePort();
    const made = await rest.ok("POST", "/runners", { regionId: region, name, apiUrl: `http://${netns.address}:${port}` });
    const process = await startRunnerProcess({ port, credential: made.apiKey, subnet: `10.${218 + i}.0.0/22`, netns, env: CAPACITY });
    runners.push({ id: made.id, key: "", process });
  }
  for (const r of runners) {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const got = await rest.ok("GET", `/runners/${r.id}`);
      if (got.state === "ready") break;
      if (Date.now() > deadline) throw new Error(`${r.id} did not become ready`);
      await new Promise((res) => setTimeout(res, 250));
    }
  }
  const schedulable = (id: string, on: boolean) => rest.ok("PATCH", `/runners/${id}/scheduling`, { unschedulable: !on });
  const nameOf = new Map<string, string>();

  /** N creates `width` at once; creates/s and the count per runner. */
  async function phase(width: number): Promise<{ rate: number; per: Record<string, number> }> {
    const ids: string[] = [];
    const per: Record<string, number> = {};
    const t0 = performance.now();
    await pool(N, width, async () => {
      const sb = await rest.ok("POST", "/sandbox", { target: "bench-fleet", autoStopInterval: 0 });
      ids.push(sb.id);
      per[sb.runnerId] = (per[sb.runnerId] ?? 0) + 1;
      return 0;
    });
    const rate = N / ((performance.now() - t0) / 1000);
    await pool(ids.length, 4, async (i) => (await rest.ok("DELETE", `/sandbox/${ids[i]}`), 0));
    return { rate, per };
  }

  log(`${machine()}; load ${loadAvg()}; N=${N}, concurrency ${WIDTHS.join(" and ")}`);
  for (const width of WIDTHS) {
    await schedulable(runners[1]!.id, false);
    const one = await phase(width);
    await schedulable(runners[1]!.id, true);
    const two = await phase(width);
    for (const [key] of Object.entries({ ...one.per, ...two.per })) {
      if (!nameOf.has(key)) nameOf.set(key, Object.keys(one.per).includes(key) ? "runner-a" : "runner-b");
    }
    const spread = (per: Record<string, number>) => ["runner-a", "runner-b"].map((n) => `${n} ${Object.entries(per).filter(([k]) => nameOf.get(k) === n).reduce((a, [, c]) => a + c, 0)}`).join(", ");
    const row = `| ${width} | ${one.rate.toFixed(2)} | ${two.rate.toFixed(2)} | ${(two.rate / one.rate).toFixed(2)} | ${spread(one.per)} | ${spread(two.per)} |`;
    log(row);
    rows.push(row);
  }
} finally {
  rest.close();
  await control.stop();
  for (const r of runners) await r.process.stop();
  for (const n of namespaces) n.remove();
}

const table = [
  `| concurrency | one runner, creates/s | two runners, creates/s | ratio | spread, one | spread, two |`,
  "|---|---|---|---|---|---|",
  ...rows,
].join("\n");
console.log(table);
if (!quick) {
  await writeFile(
    fileURLToPath(new URL("./SPREAD.md", import.meta.url)),
    `# bench/runners/spread

\`node bench/runners/spread.ts\` (root). ${machine()}; load at start ${loadAvg()}.

One control server, two \`sandbar runner\` processes on the same host (each in its own network
namespace), ${N} creates per phase (answered started; no warm pool): first with runner-b
unschedulable, then with both. Both runners share this host's cores, so the ratio shows what
placement and control add or save, not what a second machine would.

${table}
`,
  );
}
