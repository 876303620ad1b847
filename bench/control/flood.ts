/**
 * The control benchmark's authenticated GET under a flood of idle connections held at the caps
 * (the connection-limits finding): `sandbar serve` with its default caps and timeouts, the same
 * closed-loop load (autocannon from 127.0.0.1) without and with the flood, in turns, in one run.
 *
 *   node bench/control/flood.ts [--duration 8] [--connections 50] [--warmup 2] [--rounds 3]
 *
 * The flood comes from 127.0.0.2 and up, each address at SANDBAR_MAX_CONNECTIONS_PER_ADDRESS
 * connections that send nothing, as many as fit under SANDBAR_MAX_CONNECTIONS beside the load,
 * plus a steady stream of further connections from those addresses (refused at once). The run
 * without the flood in the same round is the floor; target: p99 with the flood within 2x of it
 * (median of the rounds). Prints the table and writes the "flood" section of RESULTS.md.
 */
import { readFile, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { cpus, loadavg } from "node:os";
import { startSandbar, type SandbarChild } from "./children.ts";
import { cpuPerRequest, sampleCpu } from "./cpu-usage.ts";
import { type BenchOptions, loadOptions, runLoad } from "./load.ts";
import { failures, type Run } from "./report.ts";
import { withSection } from "./sections.ts";

const PATH = "/api/api-keys/current";
const RESULTS = new URL("./RESULTS.md", import.meta.url);
const MAX_P99_RATIO = 2;
/** Room under the global cap beside the load's own connections (a reconnect, the bench's checks). */
const HEADROOM = 16;
/** The authenticated limit, far above what the rounds send (per minute): every call counted, none refused. */
const UNREACHED = "100000000";
/** Refused connection attempts per second during the flood. */
const PROBES_PER_SECOND = 100;

/** Idle connections from several addresses, kept open (reopened if the server closes one), and refused probes beside them. */
class Flood {
  private readonly sockets = new Set<Socket>();
  private up = true;
  private probes?: NodeJS.Timeout;
  /** Probes the server closed unanswered; probes it answered (let in); probes with neither within 5 s. */
  refused = 0;
  admitted = 0;
  pending = 0;
  probed = 0;
  private readonly port: number;
  private readonly plan: Array<{ address: string; count: number }>;
  /** The addresses at their cap, which probes come from. */
  private readonly full: string[];

  constructor(port: number, plan: Array<{ address: string; count: number }>, perAddress: number) {
    this.port = port;
    this.plan = plan;
    this.full = plan.filter((p) => p.count === perAddress).map((p) => p.address);
  }

  async open(): Promise<void> {
    // An address at a time: thousands of connects at once overflow the listen backlog, and a
    // connection the client sees made would reach the server seconds later (SYN-ACK retries),
    // letting probes in meanwhile. The server accepts in order, so a probe refused after an
    // address's batch says the batch is all counted.
    for (const { address, count } of this.plan) {
      await Promise.all(Array.from({ length: count }, () => this.one(address)));
      if (this.full.includes(address)) await this.probe(address);
    }
    this.refused = this.admitted = this.pending = this.probed = 0;
    let i = 0;
    this.probes = setInterval(() => void this.probe(this.full[i++ % this.full.length]!), 1000 / PROBES_PER_SECOND);
  }

  get held(): number {
    return this.sockets.size;
  }

  close(): void {
    this.up = false;
    clearInterval(this.probes);
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  private one(address: string): Promise<void> {
    return new Promise((resolve) => {
      const s = connect({ host: "127.0.0.1", port: this.port, localAddress: address });
      const opened = performance.now();
      s.on("error", () => {});
      s.once("connect", () => {
        this.sockets.add(s);
        resolve();
      });
      s.once("close", () => {
        resolve();
        // Closed by the server's headers timeout: the flood takes its place again.
        if (this.sockets.delete(s) && this.up && performance.now() - opened > 1000) void this.one(address);
      });
    });
  }

  /** One more connection from `address`, asking GET /api/config; resolves once it is answered, closed unanswered or 5 s passed. */
  private probe(address: string): Promise<void> {
    const s = connect({ host: "127.0.0.1", port: this.port, localAddress: address });
    this.probed++;
    s.on("error", () => {});
    s.write("GET /api/config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return new Promise((resolve) => {
      let answered = false;
      let late = false;
      const timer = setTimeout(() => ((late = true), s.destroy()), 5000);
      s.once("data", () => (answered = true));
      s.once("close", () => {
        clearTimeout(timer);
        if (answered) this.admitted++;
        else if (late) this.pending++;
        else this.refused++;
        resolve();
      });
    });
  }
}

interface Phase extends Run {
  rssMb?: number;
  held?: number;
}

const children: SandbarChild[] = [];
let flood: Flood | undefined;

async function main(): Promise<number> {
  const opts = loadOptions({ duration: 8, connections: 50, warmup: 2, rounds: 3 });
  const command = ["node bench/control/flood.ts", ...process.argv.slice(2)].join(" ");
  const startedAt = new Date();
  const load = loadavg();
  log("starting sandbar serve (default caps and timeouts)");
  const sandbar = await startSandbar([], { SANDBAR_RATE_LIMIT_AUTHENTICATED: UNREACHED });
  children.push(sandbar);
  const caps = /connections: at most (\d+), (\d+) per client address \(open files limit (\d+)/.exec(sandbar.output());
  if (!caps) throw new Error(`the server did not log its caps:\n${sandbar.output()}`);
  const [maxConnections, perAddress, openFiles] = caps.slice(1).map(Number) as [number, number, number];
  const port = Number(new URL(sandbar.url).port);
  const auth = { authorization: `Bearer ${sandbar.apiKey}` };
  const sample = await fetch(sandbar.url + PATH, { headers: auth });
  if (sample.status !== 200) throw new Error(`GET ${PATH} answered ${sample.status}: ${await sample.text()}`);
  await sample.arrayBuffer();

  const total = maxConnections - opts.connections - HEADROOM;
  const plan: Array<{ address: string; count: number }> = [];
  for (let left = total, n = 2; left > 0; left -= perAddress, n++) plan.push({ address: `127.0.0.${n}`, count: Math.min(perAddress, left) });
  if (plan.length > 250) throw new Error(`a flood of ${total} at ${perAddress} per address needs more than 127.0.0.2-251`);
  log(`caps: ${maxConnections} connections (open files limit ${openFiles}), ${perAddress} per address; flood: ${total} idle connections from ${plan.length} addresses`);

  const target = { url: sandbar.url + PATH, connections: opts.connections, headers: auth };
  const measure = async (name: string): Promise<Phase> => {
    log(`${name}: warm-up ${opts.warmupSeconds} s, then ${opts.durationSeconds} s at ${opts.connections} connections`);
    const warm = await runLoad({ ...target, durationSeconds: opts.warmupSeconds });
    const before = sampleCpu(sandbar.pid);
    const result = await runLoad({ ...target, durationSeconds: opts.durationSeconds });
    const bad = failures(warm) + failures(result);
    const statuses = [...warm.failedStatuses, ...result.failedStatuses].map(([status, n]) => `${n} × ${status}`).join(", ");
    if (bad > 0) log(`${name}: ${bad} errors or non-2xx responses (${[statuses, result.firstError ?? warm.firstError].filter(Boolean).join("; ")})`);
    return { ...result, errors: result.errors + failures(warm), cpu: cpuPerRequest(before, sampleCpu(sandbar.pid), result.ok), rssMb: rssMb(sandbar.pid) };
  };

  const without: Phase[] = [];
  const withFlood: Phase[] = [];
  let refused = 0;
  let admitted = 0;
  let pending = 0;
  let probed = 0;
  for (let round = 1; round <= opts.rounds; round++) {
    without.push(await measure(`round ${round}/${opts.rounds}, no flood`));
    flood = new Flood(port, plan, perAddress);
    const opening = performance.now();
    await flood.open();
    log(`flood of ${flood.held} idle connections open in ${Math.round(performance.now() - opening)} ms`);
    const phase = await measure(`round ${round}/${opts.rounds}, flood`);
    withFlood.push({ ...phase, held: flood.held });
    refused += flood.refused;
    admitted += flood.admitted;
    pending += flood.pending;
    probed += flood.probed;
    flood.close();
    flood = undefined;
  }
  await Promise.allSettled(children.splice(0).map((c) => c.stop()));

  const bad = [...without, ...withFlood].reduce((n, r) => n + failures(r), 0);
  const report = markdown({ without, withFlood, refused, admitted, pending, probed, total, plan: plan.length, maxConnections, perAddress, openFiles }, opts, command, startedAt, load);
  console.log(`\n${report}\n`);
  if (bad > 0) {
    console.error(`run invalid: ${bad} failed requests; RESULTS.md left as it was`);
    return 1;
  }
  await writeFile(RESULTS, withSection(await readFile(RESULTS, "utf8").catch(() => ""), "flood", report));
  log(`wrote the flood section of ${RESULTS.pathname}`);
  return 0;
}

interface Figures {
  without: Phase[];
  withFlood: Phase[];
  refused: number;
  admitted: number;
  pending: number;
  probed: number;
  total: number;
  plan: number;
  maxConnections: number;
  perAddress: number;
  openFiles: number;
}

function markdown(f: Figures, opts: BenchOptions, command: string, startedAt: Date, load: number[]): string {
  const ratios = (get: (r: Phase) => number) => f.withFlood.map((r, i) => get(r) / get(f.without[i]!));
  const p99Ratio = median(ratios((r) => r.p99Ms));
  const row = (name: string, rs: Phase[]) =>
    `| ${name} | ${Math.round(median(rs.map((r) => r.rps)))} | ${rs.map((r) => Math.round(r.rps)).join(" / ")} | ${ms(median(rs.map((r) => r.p50Ms)))} | ${ms(median(rs.map((r) => r.p99Ms)))} | ${rs.map((r) => ms(r.p99Ms)).join(" / ")} | ${rs.reduce((n, r) => n + failures(r), 0)} | ${Math.round(median(rs.map(cpuOf)))} | ${Math.round(median(rs.map((r) => r.rssMb ?? Number.NaN)))} |`;
  const cpu = cpus();
  const bad = [...f.without, ...f.withFlood].reduce((n, r) => n + failures(r), 0);
  return `## Authenticated GET under a connection flood

The same authenticated \`GET ${PATH}\` against one \`sandbar serve\` (rate limits on, the authenticated one out of reach; default caps and timeouts:
${f.maxConnections} connections, from its open-files limit of ${f.openFiles}, and ${f.perAddress} per client address),
${opts.connections} connections from 127.0.0.1, without and then with a flood, in ${opts.rounds} rounds (each
${opts.warmupSeconds} s warm-up then ${opts.durationSeconds} s measured per phase). The flood: ${f.total} idle connections that send
nothing (every address of ${f.plan} from 127.0.0.2 at its per-address cap; together the global cap less the load and
${HEADROOM} spare), opened before the phase's warm-up and kept open, plus ${PROBES_PER_SECOND} further connections a second from the addresses at
their cap, each asking \`GET /api/config\`, to be refused as they are accepted (of ${f.probed} attempts, ${f.refused} were closed unanswered,
${f.admitted} answered, ${f.pending} neither within 5 s, the rest still under way when the phase ended). The phase without the flood is the
floor of the same round; figures are medians of the rounds (per round alongside); RSS is the
server's at the end of the phase.

- Date: ${startedAt.toISOString()}
- Machine: ${cpu.length} × ${cpu[0]?.model ?? "unknown CPU"}, shared with other work (load average at start ${load.map((l) => l.toFixed(2)).join(" / ")})
- Node: ${process.version}

| phase | req/s | req/s per round | p50 ms | p99 ms | p99 ms per round | errors + non-2xx | server CPU µs/req | server RSS MB |
|---|---:|---|---:|---:|---|---:|---:|---:|
${row("no flood (floor)", f.without)}
${row(`flood of ${f.total} idle connections`, f.withFlood)}
| **ratio flood / floor** | **${pct(median(ratios((r) => r.rps)))}** | | ${times(median(ratios((r) => r.p50Ms)))} | **${times(p99Ratio)}** | ${ratios((r) => r.p99Ms).map(times).join(" / ")} | | ${times(median(ratios(cpuOf)))} | |

| target | measured | result |
|---|---:|---|
| p99 with the flood within ${MAX_P99_RATIO}× of the floor (median of the rounds) | ${times(p99Ratio)} | ${p99Ratio <= MAX_P99_RATIO ? "PASS" : "FAIL"} |
| the flood held through every measured phase (99% of it at the end) | ${f.withFlood.map((r) => r.held).join(" / ")} of ${f.total} | ${f.withFlood.every((r) => (r.held ?? 0) >= 0.99 * f.total) ? "PASS" : "FAIL"} |
| 0 errors and 0 non-2xx | ${bad} | ${bad === 0 ? "PASS" : "FAIL"} |

Command:

\`\`\`
${command}
\`\`\``;
}

function rssMb(pid: number): number | undefined {
  try {
    const kb = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return kb ? Number(kb[1]) / 1024 : undefined;
  } catch {
    return undefined;
  }
}

const cpuOf = (r: Run) => (r.cpu ? r.cpu.userUs + r.cpu.systemUs : Number.NaN);
const median = (xs: number[]) => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)]! : Number.NaN;
};
const ms = (v: number) => (Number.isFinite(v) ? v.toFixed(2) : "n/a");
const pct = (v: number) => (Number.isFinite(v) ? `${(v * 100).toFixed(1)}%` : "n/a");
const times = (v: number) => (Number.isFinite(v) ? `${v.toFixed(2)}×` : "n/a");

function log(line: string): void {
  console.error(`[bench] ${line}`);
}

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping`);
    flood?.close();
    void Promise.allSettled(children.splice(0).map((c) => c.stop())).finally(() => process.exit(130));
  });
}

main().then(
  (code) => process.exit(code),
  async (err: unknown) => {
    console.error(`[bench] failed: ${err instanceof Error ? err.message : String(err)}`);
    flood?.close();
    await Promise.allSettled(children.splice(0).map((c) => c.stop()));
    process.exit(1);
  },
);
