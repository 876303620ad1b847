// Preview proxy bench: requests/s and p50/p99 of a small HTTP server inside a real sandbox,
// reached through the preview proxy (host form and path form) beside the same server reached
// without the proxy in the same run: through the agent's tunnel alone (the floor the proxy adds
// to), and the same server run on the host's loopback (what the tunnel adds). Plus a 256 MiB
// download through the proxy and the tunnel alone.
//
//   node bench/preview/run.ts [--quick]     (as root; writes bench/preview/RESULTS.md)
//
// The load generator runs in a worker thread (load.ts), apart from the control server's event loop.
import { spawn, type ChildProcess } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { Worker } from "node:worker_threads";
import { tunnelSocketBeside } from "@sandbar/protocol/tunnel";
import { freePort } from "@sandbar/runner/free-port";
import { loadAvg, log, machine, ms, requireRoot, startBenchServer, stats, type Stat } from "../sandboxes/support.ts";
import type { LoadJob, LoadResult } from "./load.ts";

requireRoot("bench/preview");
const QUICK = process.argv.includes("--quick");
const SEQUENTIAL = QUICK ? 300 : 2000;
const ROUNDS = QUICK ? 2 : 4;
const CONCURRENCY = 16;
const DURATION_MS = QUICK ? 2000 : 3000;
const BIG_MIB = QUICK ? 64 : 256;
const APP_PORT = 8000;

/** The server measured, the same script in the sandbox and on the host. */
const SERVER_JS = `
const http = require("node:http");
const big = Buffer.alloc(1 << 20, 120);
http.createServer((req, res) => {
  if (req.url.startsWith("/big")) {
    const n = Number(new URL(req.url, "http://x").searchParams.get("mib"));
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": n << 20 });
    let i = 0;
    const pump = () => { while (i < n) { i++; if (!res.write(big)) return void res.once("drain", pump); } res.end(); };
    return pump();
  }
  res.writeHead(200, { "content-type": "text/plain", "content-length": 2 });
  res.end("ok");
}).listen(Number(process.argv[process.argv.length - 1]), "127.0.0.1");
`;

function load(job: LoadJob): Promise<LoadResult> {
  return new Promise((resolve, reject) => {
    const w = new Worker(new URL("./load.ts", import.meta.url), { workerData: job });
    w.once("message", (r: LoadResult) => resolve(r));
    w.once("error", reject);
  });
}

const s = await startBenchServer({ warmPool: 0 });
let hostServer: ChildProcess | undefined;
try {
  const controlPort = s.server.server.port;
  const box = await s.rest.ok("POST", "/sandbox", {});
  const id = box.id as string;
  const token = (await s.rest.ok("GET", `/sandbox/${id}/ports/${APP_PORT}/preview-url`)).token as string;
  const sh = async (command: string) => (await s.rest.ok("POST", `/toolbox/${id}/toolbox/process/execute`, { command })) as { exitCode: number; result: string };
  const node = (await sh("command -v node")).result.trim();
  if (!node) throw new Error("no node inside the sandbox");
  await sh(`cat > /tmp/server.js <<'JSEOF'\n${SERVER_JS}\nJSEOF`);
  await s.rest.ok("POST", `/toolbox/${id}/toolbox/process/session`, { sessionId: "bench" });
  await s.rest.ok("POST", `/toolbox/${id}/toolbox/process/session/bench/exec`, { command: `node /tmp/server.js ${APP_PORT}`, runAsync: true });
  for (let i = 0; ; i++) {
    if ((await sh(`node -e "require('net').connect(${APP_PORT}, '127.0.0.1').on('connect', () => process.exit(0)).on('error', () => process.exit(1))"`)).exitCode === 0) break;
    if (i > 100) throw new Error("the server in the sandbox did not start");
    await new Promise((r) => setTimeout(r, 100));
  }
  const agent = await s.server.server.sandboxes.manager.agentFor(box.organizationId, id);
  const hostPort = await freePort();
  hostServer = spawn(process.execPath, ["-e", SERVER_JS, String(hostPort)], { stdio: "ignore" });
  await new Promise((r) => setTimeout(r, 500));

  const token_ = { "x-sandbar-preview-token": token };
  const paths: Array<{ name: string; job: Omit<LoadJob, "mode"> }> = [
    { name: "same server on the host (TCP loopback)", job: { target: { host: "127.0.0.1", port: hostPort }, path: "/", headers: {} } },
    { name: "agent tunnel alone (no proxy)", job: { target: { tunnelSocket: tunnelSocketBeside(agent.key), secret: agent.secret, port: APP_PORT }, path: "/", headers: {} } },
    { name: "proxy, host form", job: { target: { host: "127.0.0.1", port: controlPort }, path: "/", headers: { host: `${APP_PORT}-${id}.preview.127.0.0.1:${controlPort}`, ...token_ } } },
    { name: "proxy, path form", job: { target: { host: "127.0.0.1", port: controlPort }, path: `/api/preview-proxy/${id}/${APP_PORT}/`, headers: token_ } },
  ];

  log("warm-up");
  for (const p of paths) await load({ ...p.job, mode: "sequential", requests: 200 });
  const latency = new Map<string, number[]>(paths.map((p) => [p.name, []]));
  const rps = new Map<string, number[]>(paths.map((p) => [p.name, []]));
  const concurrentLatency = new Map<string, number[]>(paths.map((p) => [p.name, []]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const p of paths) {
      log(`round ${round + 1}: ${p.name}`);
      const seq = await load({ ...p.job, mode: "sequential", requests: SEQUENTIAL / ROUNDS });
      if (seq.errors) throw new Error(`${p.name}: ${seq.errors} failed requests`);
      latency.get(p.name)!.push(...seq.latenciesMs);
      const con = await load({ ...p.job, mode: "concurrent", concurrency: CONCURRENCY, durationMs: DURATION_MS });
      if (con.errors) throw new Error(`${p.name}: ${con.errors} failed requests under load`);
      rps.get(p.name)!.push(con.completed / con.seconds);
      concurrentLatency.get(p.name)!.push(...con.latenciesMs);
    }
  }
  const big: Record<string, number> = {};
  for (const p of paths.slice(1, 3)) {
    log(`${BIG_MIB} MiB: ${p.name}`);
    const r = await load({ ...p.job, path: `/big?mib=${BIG_MIB}`, mode: "sequential", requests: 1 });
    if (r.errors) throw new Error(`${p.name}: the download failed`);
    big[p.name] = (BIG_MIB * 2 ** 20) / 1e6 / (r.latenciesMs[0]! / 1000);
  }

  const tunnelName = paths[1]!.name;
  const seqStats = new Map([...latency].map(([k, v]) => [k, stats(v)] as [string, Stat]));
  const best = (k: string) => Math.max(...rps.get(k)!);
  // The machine is shared: each round's figure is set against the tunnel's in the same round
  // (measured right before), and the median of those ratios is reported.
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
  const ratioTo = (k: string, base: string) => median(rps.get(k)!.map((x, i) => x / rps.get(base)![i]!));
  const floor = seqStats.get(tunnelName)!;
  const rows = paths.map((p) => {
    const st = seqStats.get(p.name)!;
    const cs = stats(concurrentLatency.get(p.name)!);
    const ratio = ratioTo(p.name, tunnelName);
    return `| ${p.name} | ${ms(st.p50)} | ${ms(st.p99)} | ${p.name === tunnelName ? "—" : (st.p50 - floor.p50 >= 0 ? "+" : "") + ms(st.p50 - floor.p50)} | ${rps.get(p.name)!.map((x) => x.toFixed(0)).join(", ")} | **${best(p.name).toFixed(0)}** | ${(ratio * 100).toFixed(0)}% | ${ms(cs.p50)} / ${ms(cs.p99)} |`;
  });
  const host = seqStats.get(paths[2]!.name)!;
  const pathForm = seqStats.get(paths[3]!.name)!;
  const hostRatio = ratioTo(paths[2]!.name, tunnelName);
  const pathRatio = ratioTo(paths[3]!.name, tunnelName);
  const verdict = (ok: boolean) => (ok ? "met" : "missed");
  const lines = [
    "# Preview proxy bench: a sandbox's web server through the proxy, beside it without",
    "",
    `Latest run: ${new Date().toISOString()} on ${machine()};`,
    `load average at the end ${loadAvg()} (the machine is shared: other work running at the same time shows up as noise).`,
    "",
    `Command: \`node bench/preview/run.ts${QUICK ? " --quick" : ""}\` (as root). One real control server (embedded PostgreSQL), one real sandbox`,
    `running a minimal node HTTP server (\`200 ok\`, 2 bytes, keep-alive) on port ${APP_PORT}; the same script on the host's`,
    "loopback. The load generator is a worker thread (`bench/preview/load.ts`, node:http keep-alive), apart from",
    "the control server's event loop but in the same process (2 cores shared by everything).",
    "",
    "Paths: **same server on the host**: plain TCP, no sandbox. **agent tunnel alone**: the client dials the sandbox",
    "agent's tunnel socket itself (header, then raw bytes to 127.0.0.1:8000 inside the sandbox): the floor the",
    "proxy adds to. **proxy, host form**: `Host: 8000-{id}.preview.…` to the control port with `X-Sandbar-Preview-Token`.",
    "**proxy, path form**: `GET /api/preview-proxy/{id}/8000/` with the token, through the gateway's route table.",
    "",
    `Sequential: ${SEQUENTIAL} requests one at a time per path (after 200 warm-up). Under load: ${CONCURRENCY} connections for`,
    `${DURATION_MS / 1000} s per round, ${ROUNDS} rounds, the paths taking turns.`,
    "",
    "| path | p50 ms | p99 ms | added p50 over the tunnel | req/s per round | best req/s | of the tunnel's req/s (median of per-round ratios) | under load p50 / p99 ms |",
    "|---|---|---|---|---|---|---|---|",
    ...rows,
    "",
    `Targets (issue 10): at least 50% of direct throughput — host form ${(hostRatio * 100).toFixed(0)}%: ${verdict(hostRatio >= 0.5)};`,
    `path form ${(pathRatio * 100).toFixed(0)}%: ${verdict(pathRatio >= 0.5)}. Under 1 ms added at p50 — host form +${ms(host.p50 - floor.p50)} ms: ${verdict(host.p50 - floor.p50 < 1)};`,
    `path form +${ms(pathForm.p50 - floor.p50)} ms: ${verdict(pathForm.p50 - floor.p50 < 1)}. Against the same server on the host (no sandbox, no tunnel):`,
    `host form ${(ratioTo(paths[2]!.name, paths[0]!.name) * 100).toFixed(0)}%, path form ${(ratioTo(paths[3]!.name, paths[0]!.name) * 100).toFixed(0)}% of its req/s, +${ms(host.p50 - seqStats.get(paths[0]!.name)!.p50)} / +${ms(pathForm.p50 - seqStats.get(paths[0]!.name)!.p50)} ms at p50.`,
    "",
    `## ${BIG_MIB} MiB download (one request, MB = 10^6 bytes)`,
    "",
    "| path | MB/s |",
    "|---|---|",
    ...Object.entries(big).map(([k, v]) => `| ${k} | ${v.toFixed(0)} |`),
    "",
  ];
  const text = lines.join("\n");
  console.log(text);
  if (!QUICK) await writeFile(new URL("./RESULTS.md", import.meta.url), text);
  await s.rest.ok("DELETE", `/sandbox/${id}`);
} finally {
  hostServer?.kill();
  await s.stop();
}
