/** The benchmark's verdicts and its table, for the terminal and for RESULTS.md. */
import { cpus, loadavg } from "node:os";
import type { CpuPerRequest } from "./cpu-usage.ts";
import type { LoadResult } from "./load.ts";

/** Targets from issue 2: throughput relative to the bare floor, and tail latency. */
export const MIN_THROUGHPUT_RATIO = 0.4;
export const MAX_P99_MS = 10;

/** One server's measured run, with its CPU cost per request when the OS tells it. */
export interface Run extends LoadResult {
  cpu?: CpuPerRequest;
}

export interface Measurement {
  path: string;
  connections: number;
  durationSeconds: number;
  warmupSeconds: number;
  sandbar: Run;
  bare: Run;
}

export interface Verdict {
  target: string;
  measured: string;
  pass: boolean;
}

export const failures = (r: LoadResult) => r.errors + [...r.failedStatuses.values()].reduce((a, b) => a + b, 0);

export function verdicts(m: Measurement): Verdict[] {
  const ratio = m.sandbar.rps / m.bare.rps;
  const bad = failures(m.sandbar) + failures(m.bare);
  return [
    { target: `throughput >= ${MIN_THROUGHPUT_RATIO * 100}% of bare`, measured: pct(ratio), pass: ratio >= MIN_THROUGHPUT_RATIO },
    { target: `p99 < ${MAX_P99_MS} ms at ${m.connections} connections`, measured: `${ms(m.sandbar.p99Ms)} ms`, pass: m.sandbar.p99Ms < MAX_P99_MS },
    { target: "0 errors and 0 non-2xx (both servers)", measured: String(bad), pass: bad === 0 },
  ];
}

export function table(m: Measurement): string {
  const row = (name: string, r: Run) =>
    `| ${name} | ${Math.round(r.rps)} | ${ms(r.p50Ms)} | ${ms(r.p99Ms)} | ${r.ok} | ${statuses(r)} | ${r.errors} | ${us(serverUs(r))} | ${us(r.cpu?.childrenUs)} |`;
  return [
    "| server | req/s | p50 ms | p99 ms | 2xx | non-2xx | errors | server CPU µs/req | its children's CPU µs/req |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    row("sandbar", m.sandbar),
    row("bare node:http", m.bare),
    `| **ratio sandbar / bare** | **${pct(m.sandbar.rps / m.bare.rps)}** | ${times(m.sandbar.p50Ms / m.bare.p50Ms)} | ${times(m.sandbar.p99Ms / m.bare.p99Ms)} | | | | ${times((serverUs(m.sandbar) ?? Number.NaN) / (serverUs(m.bare) ?? Number.NaN))} | |`,
  ].join("\n");
}

export function verdictTable(vs: Verdict[]): string {
  return ["| target | measured | result |", "|---|---:|---|", ...vs.map((v) => `| ${v.target} | ${v.measured} | ${v.pass ? "PASS" : "FAIL"} |`)].join("\n");
}

export function resultsMarkdown(m: Measurement, command: string, startedAt: Date, load: number[]): string {
  const cpu = cpus();
  return `# Control service benchmark

Authenticated \`GET ${m.path}\` (\`Authorization: Bearer <API key>\`) against \`sandbar serve\`
(embedded PostgreSQL, fresh data dir), and against a bare \`node:http\` server answering the same
path with the same JSON body (the floor). Same Node, both as child processes; HTTP/1.1
keep-alive, ${m.connections} connections, ${m.warmupSeconds} s warm-up then ${m.durationSeconds} s measured per server,
autocannon in the benchmark process. Latency percentiles are per response, in ms. CPU per
request is the server process's user + system time over the measured run divided by its 2xx
responses (children: its PostgreSQL), read from /proc; it varies less than req/s when other
work shares the machine.

- Date: ${startedAt.toISOString()}
- Machine: ${cpu.length} × ${cpu[0]?.model ?? "unknown CPU"}
- Node: ${process.version}
- Load average at start (1/5/15 min): ${load.map((l) => l.toFixed(2)).join(" / ")}

${table(m)}

${verdictTable(verdicts(m))}

Command:

\`\`\`
${command}
\`\`\`

The load generator shares the machine with both servers (and PostgreSQL), so on few cores the
bare floor is partly bounded by the client; the ratio is the figure to compare across runs.
`;
}

export const currentLoad = () => loadavg();

const serverUs = (r: Run) => (r.cpu ? r.cpu.userUs + r.cpu.systemUs : undefined);
const us = (v: number | undefined) => (v !== undefined && Number.isFinite(v) ? v.toFixed(0) : "n/a");
const ms = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "n/a");
const pct = (v: number) => (Number.isFinite(v) ? `${(v * 100).toFixed(1)}%` : "n/a");
const times = (v: number) => (Number.isFinite(v) ? `${v.toFixed(1)}×` : "n/a");
const statuses = (r: LoadResult) =>
  r.failedStatuses.size === 0 ? "0" : [...r.failedStatuses].map(([status, n]) => `${n} (${status})`).join(", ");
