// Toolbox bench: the exec round trip through the control server (REST and gRPC) beside the agent's
// own round trip measured in the same run, 256 MiB upload/download through REST beside the agent
// direct, and time to interactive through the official client 0.111.1.
//
//   node bench/toolbox/run.ts [--quick]     (as root; writes bench/toolbox/RESULTS.md)
//
// --quick: 100 exec calls each, 64 MiB transfers, 5 SDK runs (to check the bench works).
import { readFile, writeFile } from "node:fs/promises";
import http from "node:http";
import { createRequire } from "node:module";
import { randomBytes } from "node:crypto";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { bulkUpload } from "../../packages/control/src/testing/bulk-upload.ts";
import { AgentClients } from "../../packages/control/src/toolbox/agent-clients.ts";
import type { AgentDial } from "../../packages/control/src/sandboxes/runtime.ts";
import { loadAvg, log, machine, ms, requireRoot, startBenchServer, stats, type BenchServer, type Stat } from "../sandboxes/support.ts";

requireRoot("bench/toolbox");
const QUICK = process.argv.includes("--quick");
const CALLS = QUICK ? 100 : 400;
const WARMUP = 50;
const MIB = 2 ** 20;
/** Transfer sizes: memory must stay flat however large the file (1 GiB shows a buffered stream at once). */
const SIZES_MIB = QUICK ? [64] : [256, 1024];
const SDK_RUNS = QUICK ? 5 : 20;
const CHUNK = randomBytes(MIB);

interface Sdk0111 {
  Daytona: new (cfg: { apiKey: string; apiUrl: string; target?: string }) => {
    create(params?: object, opts?: { timeout?: number }): Promise<{ id: string; process: { executeCommand(cmd: string): Promise<{ exitCode: number; result: string }> } }>;
    delete(sandbox: object, timeout?: number): Promise<void>;
  };
}
const sdk = createRequire(new URL("../../packages/control/package.json", import.meta.url))("sdk-0111") as Sdk0111;

async function timed(n: number, once: () => Promise<void>): Promise<number[]> {
  for (let i = 0; i < WARMUP; i++) await once();
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await once();
    out.push(performance.now() - t0);
  }
  return out;
}

/** The three exec paths, interleaved in rounds of 50 so drifting load hits them alike. */
async function execRoundTrips(s: BenchServer, id: string, socket: AgentDial, secret: string): Promise<Record<string, number[]>> {
  const rest = async () => {
    const r = await s.rest.ok("POST", `/toolbox/${id}/toolbox/process/execute`, { command: "true" });
    if (r.exitCode !== 0) throw new Error(`REST exec exited ${r.exitCode}`);
  };
  const headers: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${s.key}`);
    req.header.set("x-sandbar-sandbox-id", id);
    return next(req);
  };
  const control = createClient(ProcessService, createGrpcTransport({ baseUrl: s.url, interceptors: [headers] }));
  const grpc = async () => {
    const r = await control.execute({ command: "true" });
    if (r.exitCode !== 0) throw new Error(`gRPC exec exited ${r.exitCode}`);
  };
  const agents = new AgentClients();
  const agent = agents.client(ProcessService, socket);
  const direct = async () => {
    const r = await agent.execute({ command: "true" }, { headers: { authorization: `Bearer ${secret}` } });
    if (r.exitCode !== 0) throw new Error(`agent exec exited ${r.exitCode}`);
  };
  const out: Record<string, number[]> = { "agent direct (gRPC, unix socket)": [], "REST (HTTP/1.1 keep-alive)": [], "gRPC on the control port": [] };
  const paths: [string, () => Promise<void>][] = [
    ["agent direct (gRPC, unix socket)", direct],
    ["REST (HTTP/1.1 keep-alive)", rest],
    ["gRPC on the control port", grpc],
  ];
  for (const [, once] of paths) for (let i = 0; i < WARMUP; i++) await once();
  const ROUND = 50;
  for (let done = 0; done < CALLS; done += ROUND) {
    for (const [name, once] of paths) out[name].push(...(await timed(Math.min(ROUND, CALLS - done), once).then((x) => x)));
  }
  agents.close();
  return out;
}

// ---- transfers ------------------------------------------------------------------------------
async function restUpload(s: BenchServer, id: string, dest: string, mib: number): Promise<number> {
  const t0 = performance.now();
  const body = await bulkUpload({ url: s.url, key: s.key, sandboxId: id, dest, mib, chunk: () => CHUNK, agent: s.rest.agent });
  const bytes = JSON.parse(body).files?.[0]?.bytes;
  if (bytes !== mib * MIB) throw new Error(`bulk-upload stored ${bytes} bytes, sent ${mib * MIB}`);
  return performance.now() - t0;
}

function restDownload(s: BenchServer, id: string, file: string, expected: number): Promise<number> {
  const base = new URL(s.url);
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.request(
      { host: base.hostname, port: base.port, method: "GET", path: `/api/toolbox/${id}/toolbox/files/download?path=${encodeURIComponent(file)}`, agent: s.rest.agent, headers: { authorization: `Bearer ${s.key}` } },
      (res) => {
        let bytes = 0;
        res.on("data", (c: Buffer) => (bytes += c.length));
        res.on("end", () => {
          if (res.statusCode !== 200) return reject(new Error(`download answered ${res.statusCode}`));
          if (bytes !== expected) return reject(new Error(`download gave ${bytes} bytes, expected ${expected}`));
          resolve(performance.now() - t0);
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end();
  });
}

async function agentUpload(socket: AgentDial, secret: string, dest: string, mib: number): Promise<number> {
  const agents = new AgentClients();
  const files = agents.client(FileService, socket);
  const t0 = performance.now();
  async function* parts() {
    yield { part: { case: "header" as const, value: { path: dest } } };
    for (let i = 0; i < mib; i++) yield { part: { case: "data" as const, value: CHUNK } };
  }
  const r = await files.uploadFile(parts(), { headers: { authorization: `Bearer ${secret}` } });
  const t = performance.now() - t0;
  agents.close();
  if (Number(r.file?.bytes) !== mib * MIB) throw new Error(`agent upload stored ${r.file?.bytes} bytes`);
  return t;
}

async function agentDownload(socket: AgentDial, secret: string, file: string, expected: number): Promise<number> {
  const agents = new AgentClients();
  const files = agents.client(FileService, socket);
  const t0 = performance.now();
  let bytes = 0;
  for await (const m of files.downloadFile({ path: file }, { headers: { authorization: `Bearer ${secret}` } })) {
    if (m.part.case === "data") bytes += m.part.value.length;
  }
  const t = performance.now() - t0;
  agents.close();
  if (bytes !== expected) throw new Error(`agent download gave ${bytes} bytes, expected ${expected}`);
  return t;
}

/** Resets the process's peak RSS to its current RSS; answers that (bytes). */
async function peakReset(): Promise<number> {
  await writeFile("/proc/self/clear_refs", "5");
  return peakRss();
}

async function peakRss(): Promise<number> {
  const status = await readFile("/proc/self/status", "utf8");
  return Number(/^VmHWM:\s+(\d+) kB/m.exec(status)![1]) * 1024;
}

async function main(): Promise<void> {
  const startedAt = new Date();
  log("building the agent and starting the control server");
  const s = await startBenchServer();
  const created: string[] = [];
  try {
    const sb = await s.rest.ok("POST", "/sandbox", { disk: 5 }); // two 1 GiB files
    created.push(sb.id);
    const agent = await s.server.server.sandboxes.manager.agentFor(sb.organizationId, sb.id);
    const { secret } = agent;
    const home = (await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "printf %s \"$HOME\"" })).result as string;

    log(`exec round trips: ${CALLS} calls per path after ${WARMUP} warm-up, interleaved`);
    const trips = await execRoundTrips(s, sb.id, agent, secret);
    const exec: [string, Stat][] = Object.entries(trips).map(([k, v]) => [k, stats(v)]);
    for (const [k, st] of exec) console.log(`${k.padEnd(34)} n=${st.n} p50=${ms(st.p50)} ms p99=${ms(st.p99)} ms mean=${ms(st.mean)} ms`);

    // Rate and the server process's peak RSS above its resident size at the start of the transfer (the
    // control server runs in this process; the kernel's high-water mark is reset before each transfer).
    const rate: Record<string, { best: number; all: number[]; peakMiB: number }> = {};
    for (const mib of SIZES_MIB) {
      log(`transfers: ${mib} MiB each way, REST and agent direct (2 rounds, best kept)`);
      const bytes = mib * MIB;
      const kinds: Record<string, () => Promise<number>> = {
        "agent upload": () => agentUpload(agent, secret, `${home}/agent.bin`, mib),
        "REST upload": () => restUpload(s, sb.id, `${home}/rest.bin`, mib),
        "agent download": () => agentDownload(agent, secret, `${home}/agent.bin`, bytes),
        "REST download": () => restDownload(s, sb.id, `${home}/rest.bin`, bytes),
      };
      const mbps = (t: number) => bytes / 1e6 / (t / 1000);
      for (let round = 0; round < 2; round++) {
        for (const [kind, run] of Object.entries(kinds)) {
          const k = `${kind} ${mib} MiB`;
          const before = await peakReset();
          const t = await run();
          const peak = (await peakRss()) - before;
          const r = (rate[k] ??= { best: 0, all: [], peakMiB: 0 });
          r.all.push(mbps(t));
          r.best = Math.max(r.best, mbps(t));
          r.peakMiB = Math.max(r.peakMiB, peak / MIB);
        }
      }
      for (const kind of Object.keys(kinds)) {
        const r = rate[`${kind} ${mib} MiB`];
        console.log(`${kind.padEnd(16)} ${mib} MiB ${r.all.map((x) => x.toFixed(0)).join(", ")} MB/s, peak RSS +${r.peakMiB.toFixed(0)} MiB`);
      }
    }
    await s.rest.ok("DELETE", `/sandbox/${created.pop()}`);

    log(`time to interactive through SDK 0.111.1: ${SDK_RUNS} runs (+1 warm-up)`);
    const daytona = new sdk.Daytona({ apiKey: s.key, apiUrl: `${s.url}/api`, target: "local" });
    const sdkTimes: number[] = [];
    for (let i = 0; i <= SDK_RUNS; i++) {
      const t0 = performance.now();
      const box = await daytona.create({}, { timeout: 120 });
      const r = await box.process.executeCommand("true");
      const t = performance.now() - t0;
      if (r.exitCode !== 0) throw new Error(`SDK executeCommand exited ${r.exitCode}`);
      if (i > 0) sdkTimes.push(t);
      await daytona.delete(box, 60);
    }
    const tti = stats(sdkTimes);
    console.log(`SDK 0.111.1 create→exec n=${tti.n} p50=${ms(tti.p50)} ms p95=${ms(tti.p95)} ms`);

    // ---- report ----
    const direct = exec[0][1];
    const restSt = exec[1][1];
    const execRows = exec.map(([k, st]) => `| ${k} | ${st.n} | ${ms(st.p50)} | ${ms(st.p99)} | ${ms(st.mean)} | ${k.startsWith("agent") ? "—" : `+${ms(st.p50 - direct.p50)}`} |`);
    const verdict = (ok: boolean) => (ok ? "met" : "missed");
    const tRow = (kind: string, floorKind: string, mib: number) => {
      const [r, floor] = [rate[`${kind} ${mib} MiB`], rate[`${floorKind} ${mib} MiB`]];
      const vs = kind.startsWith("REST") ? `${((r.best / floor.best) * 100).toFixed(0)}% of agent direct; target ≥ 300 MB/s: ${verdict(r.best >= 300)}` : "floor";
      return `| ${kind} | ${mib} MiB | ${r.all.map((x) => x.toFixed(0)).join(", ")} | **${r.best.toFixed(0)}** | +${r.peakMiB.toFixed(0)} MiB | ${vs} |`;
    };
    const md = `# Toolbox bench: exec round trip, file transfer, SDK time to interactive

Latest run: ${startedAt.toISOString()}${QUICK ? " (**--quick**: fewer calls, smaller files)" : ""} on ${machine()};
load average at the end ${loadAvg()} (the machine is shared: other work running at the same time shows up as noise).

Command: \`node bench/toolbox/run.ts\` (as root). One real control server (\`startTestServer\`, embedded
PostgreSQL, default snapshot from the shared test cache, the agent bundled fresh as test/sdk does) and one
real sandbox. The agent-direct figures are the floor: a client straight to the sandbox's agent socket
(\`manager.agentFor\` → socket + secret, one HTTP/2 connection as the control server keeps).

## Exec round trip (\`{"command":"true"}\`)

${CALLS} calls per path after ${WARMUP} warm-up calls each; the paths take turns in rounds of 50.
REST: \`POST /api/toolbox/{id}/toolbox/process/execute\` over node:http keep-alive. gRPC: connect-node
\`createGrpcTransport\` to the control port, \`ProcessService.Execute\` with \`x-sandbar-sandbox-id\`.

| path | calls | p50 ms | p99 ms | mean ms | added over agent (p50) |
|---|---|---|---|---|---|
${execRows.join("\n")}

Targets: REST p50 under 3 ms — ${verdict(restSt.p50 < 3)} (${ms(restSt.p50)} ms); under 1 ms added over the agent alone —
${verdict(restSt.p50 - direct.p50 < 1)} (+${ms(restSt.p50 - direct.p50)} ms).

## File transfer (${SIZES_MIB.join(" and ")} MiB, into the sandbox's home)

REST upload: \`POST …/files/bulk-upload\` multipart (\`files[0].path\`, \`files[0].file\`), streamed from
memory with back-pressure. REST download: \`GET …/files/download?path=\`, drained. Agent direct:
\`FileService.UploadFile\` (client stream of 1 MiB chunks) / \`DownloadFile\`. Two rounds each; MB = 10^6 bytes.
Peak RSS: the bench process (which runs the control server and the clients) above its resident size when
the transfer began, from the kernel's high-water mark (\`VmHWM\`, reset through \`/proc/self/clear_refs\`
before each transfer); flat memory means it does not grow with the file.

| transfer | size | MB/s per round | best MB/s | peak RSS | |
|---|---|---|---|---|---|
${SIZES_MIB.flatMap((mib) => [
  tRow("agent upload", "agent upload", mib),
  tRow("REST upload", "agent upload", mib),
  tRow("agent download", "agent download", mib),
  tRow("REST download", "agent download", mib),
]).join("\n")}

## Time to interactive through the official client 0.111.1

\`daytona.create()\` then \`sandbox.process.executeCommand("true")\`, ${SDK_RUNS} runs one after another after
one warm-up run, each sandbox deleted afterwards (not timed).

| runs | p50 ms | p95 ms | mean ms |
|---|---|---|---|
| ${tti.n} | ${ms(tti.p50)} | ${ms(tti.p95)} | ${ms(tti.mean)} |
`;
    const out = new URL("./RESULTS.md", import.meta.url);
    await writeFile(out, md);
    log(`wrote ${out.pathname}`);
  } finally {
    for (const id of created) await s.rest.call("DELETE", `/sandbox/${id}`).catch(() => undefined);
    await s.stop();
  }
}

await main();
