/**
 * Control-service benchmark (issue 2): authenticated GET /api/api-keys/current on the real
 * server against a bare node:http floor serving the same body, under the same load.
 *
 *   node bench/control/run.ts [--duration 10] [--connections 64] [--warmup 3] [--profile DIR]
 *
 * --profile writes a V8 CPU profile of the control server into DIR (summarise it with
 * `node bench/control/profile-summary.ts DIR/*.cpuprofile`).
 *
 * Prints the figures and PASS/FAIL per target and rewrites bench/control/RESULTS.md. Exits 0
 * whatever the verdicts (it is a measurement); exits 1 when the run itself failed, including
 * any connection error or non-2xx response, since those figures would not mean anything.
 */
import { readFile, writeFile } from "node:fs/promises";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { startBare, startSandbar, type RunningChild } from "./children.ts";
import { cpuPerRequest, sampleCpu } from "./cpu-usage.ts";
import { positiveOption, runLoad } from "./load.ts";
import { sectionsOf } from "./sections.ts";
import { currentLoad, failures, resultsMarkdown, table, verdicts, verdictTable, type Measurement, type Run } from "./report.ts";

const PATH = "/api/api-keys/current";
const RESULTS = new URL("./RESULTS.md", import.meta.url);

function options() {
  const { values } = parseArgs({
    options: {
      duration: { type: "string", default: "10" },
      connections: { type: "string", default: "64" },
      warmup: { type: "string", default: "3" },
      profile: { type: "string" },
    },
    strict: true,
  });
  return {
    durationSeconds: positiveOption("duration", values.duration),
    connections: positiveOption("connections", values.connections),
    warmupSeconds: positiveOption("warmup", values.warmup),
    /** Directory for a V8 CPU profile of the control server (written when it exits). */
    profileDir: values.profile === undefined ? undefined : resolve(values.profile),
  };
}

const children: RunningChild[] = [];
async function stopAll(): Promise<void> {
  await Promise.allSettled(children.splice(0).map((c) => c.stop()));
}

async function main(): Promise<number> {
  const opts = options();
  const command = ["node bench/control/run.ts", ...process.argv.slice(2)].join(" ");
  const startedAt = new Date();
  const load = currentLoad();

  log("starting sandbar serve (embedded PostgreSQL, fresh data dir)");
  const sandbar = await startSandbar(opts.profileDir ? ["--cpu-prof", `--cpu-prof-dir=${opts.profileDir}`] : []);
  children.push(sandbar);
  const auth = { authorization: `Bearer ${sandbar.apiKey}` };

  // The endpoint must really be authenticated, and the floor serves what it answers.
  const anonymous = await fetch(sandbar.url + PATH);
  await anonymous.arrayBuffer();
  if (anonymous.status !== 401) throw new Error(`GET ${PATH} without a key answered ${anonymous.status}, expected 401`);
  const sample = await fetch(sandbar.url + PATH, { headers: auth });
  const body = await sample.text();
  if (sample.status !== 200) throw new Error(`GET ${PATH} answered ${sample.status}: ${body}`);
  JSON.parse(body);
  log(`GET ${PATH} -> 200 ${body}`);

  const bare = await startBare(PATH, body);
  children.push(bare);

  const measure = async (name: string, server: RunningChild, headers?: Record<string, string>): Promise<Run> => {
    const load = { url: server.url + PATH, connections: opts.connections, headers };
    log(`${name}: warm-up ${opts.warmupSeconds} s`);
    const warm = await runLoad({ ...load, durationSeconds: opts.warmupSeconds });
    log(`${name}: measuring ${opts.durationSeconds} s at ${opts.connections} connections`);
    const before = sampleCpu(server.pid);
    const result = await runLoad({ ...load, durationSeconds: opts.durationSeconds });
    const cpu = cpuPerRequest(before, sampleCpu(server.pid), result.ok);
    const bad = failures(warm) + failures(result);
    if (bad > 0) log(`${name}: ${bad} errors or non-2xx responses${result.firstError ?? warm.firstError ? ` (${result.firstError ?? warm.firstError})` : ""}`);
    return { ...result, cpu };
  };
  const m: Measurement = {
    path: PATH,
    connections: opts.connections,
    durationSeconds: opts.durationSeconds,
    warmupSeconds: opts.warmupSeconds,
    sandbar: await measure("sandbar", sandbar, auth),
    bare: await measure("bare", bare),
  };
  await stopAll();

  const vs = verdicts(m);
  console.log(`\n${table(m)}\n\n${verdictTable(vs)}\n`);
  if (failures(m.sandbar) + failures(m.bare) > 0) {
    console.error("run invalid: some requests failed; RESULTS.md left as it was");
    return 1;
  }
  if (opts.profileDir) {
    log(`profiled run (the profiler slows the server): RESULTS.md left as it was; profile in ${opts.profileDir}`);
    return 0;
  }
  // Sections other runs keep in the file (rate-limits.ts) stay.
  const kept = sectionsOf(await readFile(RESULTS, "utf8").catch(() => ""));
  await writeFile(RESULTS, resultsMarkdown(m, command, startedAt, load) + (kept ? `\n${kept}` : ""));
  log(`wrote ${RESULTS.pathname}`);
  return 0;
}

function log(line: string): void {
  console.error(`[bench] ${line}`);
}

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping servers`);
    void stopAll().finally(() => process.exit(130));
  });
}

main().then(
  (code) => process.exit(code),
  async (err: unknown) => {
    console.error(`[bench] failed: ${err instanceof Error ? err.message : String(err)}`);
    await stopAll();
    process.exit(1);
  },
);
