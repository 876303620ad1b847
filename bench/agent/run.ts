/**
 * Agent benchmark: `node bench/agent/run.ts [--quick]`.
 *
 * Measures the bundled agent (packages/agent/dist/agent.mjs, built first)
 * against floors taken in the same run, on the same machine:
 * - exec round trip over the unix socket (Execute "true") beside
 *   child_process.spawn("true");
 * - upload and download MB/s beside a raw copy of the same bytes through a
 *   unix socket between two processes;
 * - start-to-ready (ready line, and first answered call) beside a bare node
 *   start; idle resident memory beside a bare idle node.
 * Prints a table and writes bench/agent/RESULTS.md.
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { connect as netConnect } from "node:net";
import { cpus, loadavg, tmpdir } from "node:os";
import * as path from "node:path";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { buildAgent } from "../../packages/agent/build.ts";
import { snapshotBlobName } from "../../packages/agent/snapshot-blob.ts";
import { socketTransport } from "../../packages/agent/src/testing/agent-process.ts";

const here = path.dirname(fileURLToPath(import.meta.url));
const quick = process.argv.includes("--quick");
const EXEC_RUNS = quick ? 200 : 1000;
const START_RUNS = quick ? 7 : 21;
const TRANSFER_MB = quick ? 128 : 512;
const CHUNK = 256 * 1024;

const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
const pct = (xs: number[], p: number) => {
  const s = sorted(xs);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const ms = (x: number) => `${x.toFixed(2)} ms`;

interface Running {
  child: ChildProcess;
  ready: { readyMs: number; cpuMs: number };
  readyWallMs: number;
}

/** Starts the bundled agent and waits for its ready line. */
async function startBundle(bundle: string, dir: string, n: number, extra: string[] = [], env: NodeJS.ProcessEnv = process.env, nodeArgs: string[] = []): Promise<Running & { socket: string; secret: string }> {
  const socket = path.join(dir, `agent-${n}.sock`);
  const secret = "bench-secret";
  const secretFile = path.join(dir, "secret");
  await writeFile(secretFile, secret);
  const t0 = performance.now();
  const child = spawn(process.execPath, [...nodeArgs, bundle, "--socket", socket, "--secret-file", secretFile, "--root", dir, "--state-dir", path.join(dir, `state-${n}`), ...extra], {
    stdio: ["ignore", "pipe", "inherit"],
    env,
  });
  const line = await new Promise<string>((resolve, reject) => {
    let buf = "";
    child.stdout!.on("data", (d: Buffer) => {
      buf += d.toString();
      const nl = buf.indexOf("\n");
      if (nl >= 0) resolve(buf.slice(0, nl));
    });
    child.once("exit", (code) => reject(new Error(`agent exited with ${code}`)));
  });
  return { child, ready: JSON.parse(line), readyWallMs: performance.now() - t0, socket, secret };
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  await exited;
}

/** Resident memory of a process in MB: total, private (anonymous), file-backed. */
async function rss(pid: number) {
  const s = await readFile(`/proc/${pid}/status`, "utf8");
  const kb = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+)`).exec(s)![1]) / 1024;
  return { total: kb("VmRSS"), anon: kb("RssAnon"), file: kb("RssFile") };
}

/** Spawn-to-first-line and idle memory of a bare node. */
async function bareNode(idle: boolean): Promise<{ wallMs: number; rss?: Awaited<ReturnType<typeof rss>> }> {
  const t0 = performance.now();
  const child = spawn(process.execPath, ["-e", idle ? 'console.log("up"); setInterval(() => {}, 1e6)' : 'console.log("up")'], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((r) => child.stdout!.once("data", r));
  const wallMs = performance.now() - t0;
  let mem;
  if (idle) {
    await new Promise((r) => setTimeout(r, 1000));
    mem = await rss(child.pid!);
  }
  await stop(child);
  return { wallMs, rss: mem };
}

async function benchStartup(bundle: string, dir: string) {
  const ready: number[] = [];
  const firstCall: number[] = [];
  /** The same with Node's compile cache off (the bundle's dist/compile-cache unused). */
  const firstCallNoCache: number[] = [];
  const selfReady: number[] = [];
  const bare: number[] = [];
  for (let i = 0; i < START_RUNS; i++) {
    bare.push((await bareNode(false)).wallMs);
    const t0 = performance.now();
    const a = await startBundle(bundle, dir, i);
    ready.push(a.readyWallMs);
    selfReady.push(a.ready.readyMs);
    const info = createClient(InfoService, socketTransport(a.socket, a.secret));
    await info.getVersion({});
    firstCall.push(performance.now() - t0);
    await stop(a.child);
    const t1 = performance.now();
    const b = await startBundle(bundle, dir, 1000 + i, [], { ...process.env, NODE_DISABLE_COMPILE_CACHE: "1" });
    await createClient(InfoService, socketTransport(b.socket, b.secret)).getVersion({});
    firstCallNoCache.push(performance.now() - t1);
    await stop(b.child);
  }
  const idleAgent = await startBundle(bundle, dir, 999);
  await new Promise((r) => setTimeout(r, 1000));
  const agentIdle = await rss(idleAgent.child.pid!);
  await stop(idleAgent.child);
  const nodeIdle = (await bareNode(true)).rss!;
  // A first call that comes a little after the agent is up (the control plane's own work first):
  // lazy loading pays its loading then; --preload has done it meanwhile.
  const later = { lazy: [] as number[], preload: [] as number[] };
  let preloadIdle;
  for (let i = 0; i < START_RUNS; i++) {
    for (const mode of ["lazy", "preload"] as const) {
      const a = await startBundle(bundle, dir, 2000 + i * 2 + (mode === "preload" ? 1 : 0), mode === "preload" ? ["--preload"] : []);
      await new Promise((r) => setTimeout(r, 300));
      const proc = createClient(ProcessService, socketTransport(a.socket, a.secret));
      const t0 = performance.now();
      await proc.execute({ command: "true" });
      later[mode].push(performance.now() - t0);
      if (mode === "preload" && i === 0) {
        await new Promise((r) => setTimeout(r, 700));
        preloadIdle = await rss(a.child.pid!);
      }
      await stop(a.child);
    }
  }
  return { ready, firstCall, firstCallNoCache, selfReady, bare, agentIdle, nodeIdle, later, preloadIdle: preloadIdle! };
}

/**
 * The bundle against its startup snapshot (build.ts, snapshot-blob.ts), with and without
 * --use-openssl-ca, all with --preload as sandboxes run them (the last mode is what they run),
 * interleaved: ready line, first GetVersion and first Execute("true") sent at once after the
 * ready line (each from spawn, separate starts), and idle memory.
 */
const START_MODES = ["bundle", "snapshot", "bundle, --use-openssl-ca", "snapshot, --use-openssl-ca"] as const;
type StartMode = (typeof START_MODES)[number];

async function benchSnapshot(bundle: string, dir: string) {
  const blob = ["--snapshot-blob", path.join(path.dirname(bundle), snapshotBlobName())];
  const nodeArgs: Record<StartMode, string[]> = {
    bundle: [],
    snapshot: blob,
    "bundle, --use-openssl-ca": ["--use-openssl-ca"],
    "snapshot, --use-openssl-ca": ["--use-openssl-ca", ...blob],
  };
  const r = Object.fromEntries(START_MODES.map((m) => [m, { ready: [] as number[], selfReady: [] as number[], firstCall: [] as number[], firstExec: [] as number[] }])) as Record<StartMode, { ready: number[]; selfReady: number[]; firstCall: number[]; firstExec: number[] }>;
  const idle: Partial<Record<StartMode, Awaited<ReturnType<typeof rss>>>> = {};
  let n = 3000;
  for (let i = 0; i < START_RUNS; i++) {
    // Rotated each round, so no mode always follows the same one.
    const order = START_MODES.map((_, k) => START_MODES[(k + i) % START_MODES.length]!);
    for (const mode of order) {
      let t0 = performance.now();
      const a = await startBundle(bundle, dir, n++, ["--preload"], process.env, nodeArgs[mode]);
      r[mode].ready.push(a.readyWallMs);
      r[mode].selfReady.push(a.ready.readyMs);
      await createClient(InfoService, socketTransport(a.socket, a.secret)).getVersion({});
      r[mode].firstCall.push(performance.now() - t0);
      if (i === 0) {
        await new Promise((res) => setTimeout(res, 1000));
        idle[mode] = await rss(a.child.pid!);
      }
      await stop(a.child);
      t0 = performance.now();
      const b = await startBundle(bundle, dir, n++, ["--preload"], process.env, nodeArgs[mode]);
      await createClient(ProcessService, socketTransport(b.socket, b.secret)).execute({ command: "true" });
      r[mode].firstExec.push(performance.now() - t0);
      await stop(b.child);
    }
  }
  return { runs: r, idle: idle as Record<StartMode, Awaited<ReturnType<typeof rss>>> };
}

async function benchExec(client: ReturnType<typeof createClient<typeof ProcessService>>, info: ReturnType<typeof createClient<typeof InfoService>>) {
  for (let i = 0; i < 50; i++) await client.execute({ command: "true" });
  const spawnTrue = async () => {
    const t0 = performance.now();
    await new Promise((r) => spawn("true", [], { stdio: "ignore" }).once("close", r));
    return performance.now() - t0;
  };
  for (let i = 0; i < 50; i++) await spawnTrue();
  const exec: number[] = [];
  const execProgram: number[] = [];
  const rpc: number[] = [];
  const floor: number[] = [];
  // Interleaved, so all see the same machine load.
  for (let i = 0; i < EXEC_RUNS; i++) {
    let t0 = performance.now();
    await client.execute({ command: "true" });
    exec.push(performance.now() - t0);
    floor.push(await spawnTrue());
    t0 = performance.now();
    await client.execute({ command: "/bin/true" });
    execProgram.push(performance.now() - t0);
    t0 = performance.now();
    await info.getVersion({});
    rpc.push(performance.now() - t0);
  }
  return { exec, execProgram, rpc, floor };
}

/** MB/s through a raw unix socket between this process and a child: the copy floor. */
let rawRuns = 0;
async function rawCopy(dir: string, file: string, direction: "up" | "down"): Promise<number> {
  const n = ++rawRuns;
  const sock = path.join(dir, `raw-${direction}-${n}.sock`);
  const out = path.join(dir, `raw-${direction}-${n}.out`);
  // The peer process does the file side, as the agent would.
  const peerCode =
    direction === "down"
      ? `const net=require("net"),fs=require("fs");const s=net.createServer(c=>{fs.createReadStream(${JSON.stringify(file)},{highWaterMark:${CHUNK}}).pipe(c)});s.listen(${JSON.stringify(sock)},()=>console.log("up"))`
      : `const net=require("net"),fs=require("fs");const s=net.createServer(c=>{const w=fs.createWriteStream(${JSON.stringify(out)});c.pipe(w);w.on("finish",()=>{console.log("done")})});s.listen(${JSON.stringify(sock)},()=>console.log("up"))`;
  const peer = spawn(process.execPath, ["-e", peerCode], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((resolve, reject) => {
    peer.stdout!.once("data", resolve);
    peer.once("exit", (code) => reject(new Error(`raw copy peer exited with ${code}`)));
  });
  const bytes = TRANSFER_MB * 1024 * 1024;
  const t0 = performance.now();
  if (direction === "down") {
    const c = netConnect(sock);
    let n = 0;
    for await (const chunk of c) n += (chunk as Buffer).length;
    if (n !== bytes) throw new Error(`raw copy moved ${n} bytes`);
  } else {
    const done = new Promise((r) => peer.stdout!.once("data", r));
    const c = netConnect(sock);
    await pipeline(createReadStream(file, { highWaterMark: CHUNK }), c);
    await done;
  }
  const secs = (performance.now() - t0) / 1000;
  await stop(peer);
  await rm(out, { force: true });
  await rm(sock, { force: true });
  return TRANSFER_MB / secs;
}

async function benchTransfer(files: ReturnType<typeof createClient<typeof FileService>>, dir: string) {
  const source = path.join(dir, "source.bin");
  const block = Buffer.alloc(CHUNK);
  for (let i = 0; i < CHUNK; i++) block[i] = (i * 13) & 0xff;
  await pipeline(
    (async function* () {
      for (let i = 0; i < (TRANSFER_MB * 1024 * 1024) / CHUNK; i++) yield block;
    })(),
    createWriteStream(source),
  );
  const results = { up: [] as number[], down: [] as number[], rawUp: [] as number[], rawDown: [] as number[] };
  for (let round = 0; round < (quick ? 1 : 2); round++) {
    results.rawUp.push(await rawCopy(dir, source, "up"));
    let t0 = performance.now();
    const res = await files.uploadFile(
      (async function* () {
        yield { part: { case: "header" as const, value: { path: path.join(dir, "uploaded.bin") } } };
        for await (const chunk of createReadStream(source, { highWaterMark: CHUNK })) yield { part: { case: "data" as const, value: chunk as Buffer } };
      })(),
    );
    if (res.file?.bytes !== BigInt(TRANSFER_MB * 1024 * 1024)) throw new Error("upload incomplete");
    results.up.push(TRANSFER_MB / ((performance.now() - t0) / 1000));

    results.rawDown.push(await rawCopy(dir, source, "down"));
    t0 = performance.now();
    let n = 0;
    for await (const m of files.downloadFile({ path: source })) if (m.part.case === "data") n += m.part.value.length;
    if (n !== TRANSFER_MB * 1024 * 1024) throw new Error("download incomplete");
    results.down.push(TRANSFER_MB / ((performance.now() - t0) / 1000));
  }
  return results;
}

async function main() {
  const dir = await mkdtemp(path.join(tmpdir(), "agent-bench-"));
  const load0 = loadavg();
  const distDir = path.join(here, "..", "..", "packages", "agent", "dist");
  const bundle = await buildAgent(distDir);
  try {
    process.stdout.write("start-to-ready and idle memory...\n");
    const start = await benchStartup(bundle, dir);
    process.stdout.write("bundle against snapshot...\n");
    const snap = await benchSnapshot(bundle, dir);

    const agent = await startBundle(bundle, dir, 1000);
    const transport = socketTransport(agent.socket, agent.secret);
    process.stdout.write("exec round trips...\n");
    const exec = await benchExec(createClient(ProcessService, transport), createClient(InfoService, transport));
    process.stdout.write(`transfers (${TRANSFER_MB} MiB each way)...\n`);
    const transfer = await benchTransfer(createClient(FileService, transport), dir);
    const afterTransfer = await rss(agent.child.pid!);
    // V8 gives unused heap back to the system after some seconds of quiet.
    await new Promise((r) => setTimeout(r, 15_000));
    const settled = await rss(agent.child.pid!);
    await stop(agent.child);
    const load1 = loadavg();

    const best = (xs: number[]) => Math.max(...xs);
    const rows: [string, string, string, string, string][] = [];
    const execP50 = pct(exec.exec, 50);
    const floorP50 = pct(exec.floor, 50);
    rows.push(["exec round trip p50", ms(execP50), `spawn("true") p50 ${ms(floorP50)}`, "within 1 ms of the floor", execP50 - floorP50 <= 1 ? "met" : `missed (+${(execP50 - floorP50).toFixed(2)} ms)`]);
    rows.push(["exec round trip p99", ms(pct(exec.exec, 99)), `spawn("true") p99 ${ms(pct(exec.floor, 99))}`, "", ""]);
    rows.push(["exec of a program (/bin/true) p50 / p99", `${ms(pct(exec.execProgram, 50))} / ${ms(pct(exec.execProgram, 99))}`, "", "", ""]);
    rows.push(["RPC round trip (GetVersion) p50 / p99", `${ms(pct(exec.rpc, 50))} / ${ms(pct(exec.rpc, 99))}`, "", "", ""]);
    const up = best(transfer.up);
    const rawUp = best(transfer.rawUp);
    const down = best(transfer.down);
    const rawDown = best(transfer.rawDown);
    rows.push(["upload", `${up.toFixed(0)} MB/s`, `raw socket copy ${rawUp.toFixed(0)} MB/s`, ">= 50% of raw", `${((up / rawUp) * 100).toFixed(0)}% ${up / rawUp >= 0.5 ? "met" : "missed"}`]);
    rows.push(["download", `${down.toFixed(0)} MB/s`, `raw socket copy ${rawDown.toFixed(0)} MB/s`, ">= 50% of raw", `${((down / rawDown) * 100).toFixed(0)}% ${down / rawDown >= 0.5 ? "met" : "missed"}`]);
    const readyP50 = pct(start.ready, 50);
    const firstP50 = pct(start.firstCall, 50);
    const bareP50 = pct(start.bare, 50);
    rows.push(["start to ready line p50", ms(readyP50), `bare node start p50 ${ms(bareP50)}`, "< 60 ms", readyP50 < 60 ? "met" : `missed (node alone: ${bareP50.toFixed(0)} ms)`]);
    rows.push(["start to first answered call p50", ms(firstP50), `ready line +${(firstP50 - readyP50).toFixed(1)} ms`, "", ""]);
    rows.push(["start to first answered call p50 without the compile cache", ms(pct(start.firstCallNoCache, 50)), "`NODE_DISABLE_COMPILE_CACHE=1`, interleaved", "", ""]);
    rows.push(["agent's own ready time p50 (process uptime)", ms(pct(start.selfReady, 50)), "node boot included", "", ""]);
    rows.push(["first Execute, 300 ms after ready, p50: lazy / --preload", `${ms(pct(start.later.lazy, 50))} / ${ms(pct(start.later.preload, 50))}`, `warm exec p50 ${ms(execP50)}`, "", ""]);
    rows.push([
      "idle resident memory",
      `${start.agentIdle.total.toFixed(1)} MB (${start.agentIdle.anon.toFixed(1)} private + ${start.agentIdle.file.toFixed(1)} shared file)`,
      `bare idle node ${start.nodeIdle.total.toFixed(1)} MB (${start.nodeIdle.anon.toFixed(1)} + ${start.nodeIdle.file.toFixed(1)})`,
      "< 40 MB",
      start.agentIdle.total < 40 ? "met" : `missed (node alone: ${start.nodeIdle.total.toFixed(0)} MB)`,
    ]);
    rows.push(["idle resident memory with --preload", `${start.preloadIdle.total.toFixed(1)} MB (${start.preloadIdle.anon.toFixed(1)} private + ${start.preloadIdle.file.toFixed(1)} shared file)`, "", "", ""]);
    const mem = (x: Awaited<ReturnType<typeof rss>>) => `${x.total.toFixed(1)} MB (${x.anon.toFixed(1)} private + ${x.file.toFixed(1)} shared file)`;
    for (const mode of START_MODES) {
      const x = snap.runs[mode];
      rows.push([
        `--preload, ${mode}: ready line / own ready time / first answered call / first Execute, p50`,
        `${ms(pct(x.ready, 50))} / ${ms(pct(x.selfReady, 50))} / ${ms(pct(x.firstCall, 50))} / ${ms(pct(x.firstExec, 50))}`,
        `idle ${mem(snap.idle[mode])}`,
        "",
        "",
      ]);
    }
    rows.push(["resident right after all of the above", `${afterTransfer.total.toFixed(1)} MB (${afterTransfer.anon.toFixed(1)} private)`, "", "", ""]);
    rows.push(["resident 15 s later (idle)", `${settled.total.toFixed(1)} MB (${settled.anon.toFixed(1)} private)`, "", "", ""]);

    const table = [
      "| measure | agent | floor (same run) | target | result |",
      "| --- | --- | --- | --- | --- |",
      ...rows.map((r) => `| ${r.join(" | ")} |`),
    ].join("\n");
    const header = [
      "# Agent benchmark results",
      "",
      `Run: ${new Date().toISOString()}, node ${process.version}, ${cpus().length} CPUs (${cpus()[0]?.model ?? "?"}), load average ${load0[0].toFixed(2)} at start and ${load1[0].toFixed(2)} at end${quick ? ", --quick" : ""}.`,
      `Command: \`node bench/agent/run.ts\`. Exec: ${EXEC_RUNS} rounds of Execute("true"), spawn("true"), Execute("/bin/true") and GetVersion, sequential, over one HTTP/2 connection. Transfers: ${TRANSFER_MB} MiB in ${CHUNK / 1024} KiB chunks, best of the rounds. Start: ${START_RUNS} starts of the bundle.`,
      "",
    ].join("\n");
    const notes = await readFile(path.join(here, "NOTES.md"), "utf8").catch(() => "");
    const report = `${header}${table}\n${notes ? `\n${notes}` : ""}`;
    process.stdout.write(`\n${table}\n`);
    await writeFile(path.join(here, "RESULTS.md"), report);
    process.stdout.write(`\nwritten to ${path.join(here, "RESULTS.md")}\n`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
