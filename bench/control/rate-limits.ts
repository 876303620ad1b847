/**
 * The rate limiter's cost (issue 10): the authenticated GET of the control benchmark against
 * three `sandbar serve` children in the same run: limits off (every SANDBAR_RATE_LIMIT_* 0),
 * limits on with the memory store, and limits on with the PostgreSQL store (the server's own
 * embedded database). Rounds alternate between them so that load from elsewhere on the machine
 * falls on all three alike.
 *
 *   node bench/control/rate-limits.ts [--duration 3] [--connections 64] [--warmup 1] [--rounds 10]
 *
 * With limits on, the authenticated limit is set far above what the run can send: every call
 * is counted and gets its headers (the cost measured), none is refused (a refusal would be
 * cheaper than the work it saves, and would end the run). Prints the table and writes it as
 * the "rate-limits" section of RESULTS.md (the main run keeps that section).
 */
import { readFile, writeFile } from "node:fs/promises";
import { cpus, loadavg } from "node:os";
import { startSandbar, type SandbarChild } from "./children.ts";
import { cpuPerRequest, sampleCpu } from "./cpu-usage.ts";
import { type BenchOptions, loadOptions, runLoad } from "./load.ts";
import { failures, type Run } from "./report.ts";
import { withSection } from "./sections.ts";

const PATH = "/api/api-keys/current";
const RESULTS = new URL("./RESULTS.md", import.meta.url);
/** Far above what one run can send at any rate this machine reaches (the limit is per minute). */
const UNREACHED = "100000000";
/** The cost of a limiter over 10% of the throughput fails the target. */
const MAX_LOSS = 0.1;

const CONFIGS: Array<{ name: string; env: Record<string, string> }> = [
  {
    name: "limits off",
    env: {
      SANDBAR_RATE_LIMIT_ANONYMOUS: "0",
      SANDBAR_RATE_LIMIT_AUTHENTICATED: "0",
      SANDBAR_RATE_LIMIT_SANDBOX_CREATE: "0",
      SANDBAR_RATE_LIMIT_SANDBOX_LIFECYCLE: "0",
      SANDBAR_RATE_LIMIT_FAILED_AUTH: "0",
    },
  },
  { name: "limits on, memory store", env: { SANDBAR_RATE_LIMIT_STORE: "memory", SANDBAR_RATE_LIMIT_AUTHENTICATED: UNREACHED } },
  { name: "limits on, PostgreSQL store", env: { SANDBAR_RATE_LIMIT_STORE: "postgres", SANDBAR_RATE_LIMIT_AUTHENTICATED: UNREACHED } },
];

const children: SandbarChild[] = [];

async function main(): Promise<number> {
  const opts = loadOptions({ duration: 3, connections: 64, warmup: 1, rounds: 10 });
  const command = ["node bench/control/rate-limits.ts", ...process.argv.slice(2)].join(" ");
  const startedAt = new Date();
  const load = loadavg();
  for (const c of CONFIGS) {
    log(`starting sandbar serve: ${c.name}`);
    children.push(await startSandbar([], c.env));
  }
  // Each server really limits as configured: headers with limits on, none with them off.
  for (const [i, child] of children.entries()) {
    const res = await fetch(child.url + PATH, { headers: { authorization: `Bearer ${child.apiKey}` } });
    await res.arrayBuffer();
    const limit = res.headers.get("x-ratelimit-limit");
    if (res.status !== 200 || (i === 0) !== (limit === null)) throw new Error(`${CONFIGS[i]!.name}: GET ${PATH} answered ${res.status}, X-RateLimit-Limit ${limit}`);
  }

  const runs: Run[][] = CONFIGS.map(() => []);
  for (let round = 1; round <= opts.rounds; round++) {
    for (const [i, child] of children.entries()) {
      const target = { url: child.url + PATH, connections: opts.connections, headers: { authorization: `Bearer ${child.apiKey}` } };
      log(`round ${round}/${opts.rounds}, ${CONFIGS[i]!.name}: warm-up ${opts.warmupSeconds} s, then ${opts.durationSeconds} s`);
      await runLoad({ ...target, durationSeconds: opts.warmupSeconds });
      const before = sampleCpu(child.pid);
      const result = await runLoad({ ...target, durationSeconds: opts.durationSeconds });
      runs[i]!.push({ ...result, cpu: cpuPerRequest(before, sampleCpu(child.pid), result.ok) });
    }
  }
  await Promise.allSettled(children.splice(0).map((c) => c.stop()));

  const bad = runs.flat().reduce((n, r) => n + failures(r), 0);
  const report = markdown(runs, opts, command, startedAt, load);
  console.log(`\n${report}\n`);
  if (bad > 0) {
    console.error(`run invalid: ${bad} failed requests; RESULTS.md left as it was`);
    return 1;
  }
  await writeFile(RESULTS, withSection(await readFile(RESULTS, "utf8").catch(() => ""), "rate-limits", report));
  log(`wrote the rate-limits section of ${RESULTS.pathname}`);
  return 0;
}

function markdown(runs: Run[][], opts: BenchOptions, command: string, startedAt: Date, load: number[]): string {
  const sum = (rs: Run[]) => ({
    rps: rs.reduce((a, r) => a + r.ok, 0) / rs.reduce((a, r) => a + r.seconds, 0),
    p50: median(rs.map((r) => r.p50Ms)),
    p99: median(rs.map((r) => r.p99Ms)),
    cpu: median(rs.map(cpuOf)),
    pgCpu: median(rs.map((r) => r.cpu?.childrenUs ?? Number.NaN)),
  });
  const totals = runs.map(sum);
  const off = totals[0]!;
  // Load from elsewhere changes between rounds far more than between the servers of one round:
  // the loss is judged per round (each server against limits off in the same round), then the median.
  const roundLoss = (i: number) => median(runs[i]!.map((r, round) => 1 - r.rps / runs[0]![round]!.rps));
  const cpuCost = (i: number) => median(runs[i]!.map((r, round) => cpuOf(r) - cpuOf(runs[0]![round]!)));
  const rows = totals.map((t, i) => {
    const perRound = runs[i]!.map((r) => Math.round(r.rps)).join(" / ");
    const loss = i === 0 ? "" : `${pct(roundLoss(i))} (all rounds: ${pct(1 - t.rps / off.rps)})`;
    const cpu = i === 0 ? t.cpu.toFixed(0) : `${t.cpu.toFixed(0)} (${signed(cpuCost(i))})`;
    return `| ${CONFIGS[i]!.name} | ${Math.round(t.rps)} | ${perRound} | ${loss} | ${t.p50.toFixed(2)} | ${t.p99.toFixed(2)} | ${cpu} | ${t.pgCpu.toFixed(0)} |`;
  });
  const verdicts = totals.slice(1).map((_, j) => {
    const loss = roundLoss(j + 1);
    return `| ${CONFIGS[j + 1]!.name}: throughput lost < ${MAX_LOSS * 100}% (median of the rounds) | ${pct(loss)} | ${loss < MAX_LOSS ? "PASS" : "FAIL"} |`;
  });
  const cpu = cpus();
  return `## Rate limiter cost

The same authenticated \`GET ${PATH}\` against three \`sandbar serve\` children started together:
limits off (every \`SANDBAR_RATE_LIMIT_*\` 0), limits on with the memory store, limits on with the
PostgreSQL store (the server's embedded database; far from the limit calls are counted in memory and
added to the table every 50 ms, near it each call is an upsert; blocks are cached in memory).
With limits on every call is counted and answered with its \`X-RateLimit-*\` headers; the
authenticated limit is set above what the run sends, so none is refused. ${opts.rounds} rounds, each
${opts.warmupSeconds} s warm-up then ${opts.durationSeconds} s measured per server, servers in turn, ${opts.connections} connections.
req/s is over all rounds (per round alongside); the loss is the median over the rounds of
each round's loss against limits off in that round (other work on the machine changes far more
between rounds than within one); latencies and CPU per request are medians of the rounds;
"PostgreSQL CPU" is the server's children (its embedded database).

- Date: ${startedAt.toISOString()}
- Machine: ${cpu.length} × ${cpu[0]?.model ?? "unknown CPU"}, shared with other work (load average at start ${load.map((l) => l.toFixed(2)).join(" / ")})
- Node: ${process.version}

| server | req/s | req/s per round | throughput lost vs off (median of rounds) | p50 ms | p99 ms | server CPU µs/req (median change vs off) | PostgreSQL CPU µs/req |
|---|---:|---|---:|---:|---:|---:|---:|
${rows.join("\n")}

| target | measured | result |
|---|---:|---|
${verdicts.join("\n")}

Command:

\`\`\`
${command}
\`\`\``;
}

const cpuOf = (r: Run) => (r.cpu ? r.cpu.userUs + r.cpu.systemUs : Number.NaN);
const signed = (v: number) => (Number.isFinite(v) ? `${v >= 0 ? "+" : ""}${v.toFixed(0)} per round` : "n/a");
const median = (xs: number[]) => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : Number.NaN;
};
const pct = (v: number) => `${(v * 100).toFixed(1)}%`;

function log(line: string): void {
  console.error(`[bench] ${line}`);
}

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping servers`);
    void Promise.allSettled(children.splice(0).map((c) => c.stop())).finally(() => process.exit(130));
  });
}

main().then(
  (code) => process.exit(code),
  async (err: unknown) => {
    console.error(`[bench] failed: ${err instanceof Error ? err.message : String(err)}`);
    await Promise.allSettled(children.splice(0).map((c) => c.stop()));
    process.exit(1);
  },
);
