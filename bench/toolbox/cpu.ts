// CPU cost of one exec call on each hop, for profiling on a shared machine (wall-clock p50s move
// with the neighbours' load; CPU time per call much less): the control process's own CPU
// (process.cpuUsage, which includes the bench's clients) and the sandbox's (its cpuacct cgroup:
// the agent, its shells and the user cgroup), per call, beside the wall-clock p50.
//
//   node bench/toolbox/cpu.ts [calls] [--profile <dir>]     (as root; prints, writes nothing else)
//
// --profile: a CPU profile of this process (control server and clients) over the REST calls
// of the second round only (no start-up, no warm-up), as <dir>/rest.cpuprofile.
// --upload <MiB>: instead, REST bulk-uploads of that size (3 rounds), with the same CPU figures per
// GiB moved (the profile then covers the last upload, as <dir>/upload.cpuprofile). The client runs
// in a process of its own (upload-client.ts): "control" is the control process alone.
// --warm <runs>: instead, warm-pool create -> first exec (pool of 1, refilled untimed between runs),
// p50 of each part and control's CPU per run.
// --download: with --upload, then REST downloads (GET …/files/download, drained) of the uploaded file,
// 3 rounds, with the same CPU figures per GiB.
// --agent <dir>: sandboxes run that agent bundle (e.g. a copy of packages/agent/dist from another
// commit, for interleaved A/B runs) instead of one built from this tree.
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { Session } from "node:inspector/promises";
import * as path from "node:path";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { sandboxCgroup } from "../../packages/control/src/testing/sandbox-cgroup.ts";
import { AgentClients } from "../../packages/control/src/toolbox/agent-clients.ts";
import { loadAvg, log, ms, requireRoot, startBenchServer, stats } from "../sandboxes/support.ts";

requireRoot("bench/toolbox/cpu");
const CALLS = Number(process.argv[2] ?? 300) || 300;
const profileAt = process.argv.indexOf("--profile");
const PROFILE_DIR = profileAt > 0 ? process.argv[profileAt + 1] : undefined;

const uploadAt = process.argv.indexOf("--upload");
const UPLOAD_MIB = uploadAt > 0 ? Number(process.argv[uploadAt + 1]) : 0;
const MIB = 2 ** 20;
const run = promisify(execFile);

async function startProfile(name: string): Promise<() => Promise<void>> {
  if (!PROFILE_DIR) return async () => undefined;
  const session = new Session();
  session.connect();
  await session.post("Profiler.enable");
  await session.post("Profiler.start");
  return async () => {
    const { profile } = await session.post("Profiler.stop");
    await mkdir(PROFILE_DIR, { recursive: true });
    await writeFile(path.join(PROFILE_DIR, `${name}.cpuprofile`), JSON.stringify(profile));
    session.disconnect();
  };
}

/** One multipart bulk-upload of `mib` MiB by a client process; resolves to that client's CPU time. */
async function upload(base: string, key: string, id: string, dest: string, mib: number): Promise<NodeJS.CpuUsage> {
  const client = path.join(import.meta.dirname, "upload-client.ts");
  const { stdout } = await run(process.execPath, [client, base, key, id, dest, String(mib)], { maxBuffer: 1 << 20 });
  return JSON.parse(stdout.trim().split("\n").pop()!) as NodeJS.CpuUsage;
}

const warmAt = process.argv.indexOf("--warm");
const WARM_RUNS = warmAt > 0 ? Number(process.argv[warmAt + 1]) : 0;

const agentAt = process.argv.indexOf("--agent");
const s = await startBenchServer({ warmPool: WARM_RUNS > 0 ? 1 : 0, ...(agentAt > 0 ? { agentBundle: process.argv[agentAt + 1] } : {}) });
if (WARM_RUNS > 0) {
  const pool = s.server.server.sandboxes.manager.pools!.default!;
  const creates: number[] = [];
  const execs: number[] = [];
  const seconds: number[] = [];
  let cpu = 0;
  for (let i = 0; i < WARM_RUNS + 3; i++) {
    while (pool.stats().ready < 1) await new Promise((r) => setTimeout(r, 20));
    const stop = i === WARM_RUNS + 2 ? await startProfile("warm") : async () => undefined;
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const sb = await s.rest.ok("POST", "/sandbox", {});
    const t1 = performance.now();
    const r = await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
    const t2 = performance.now();
    const c = process.cpuUsage(c0);
    await stop();
    if (r.exitCode !== 0) throw new Error("exec failed");
    // The same call again at once: what the first one pays beyond a hot one.
    const t3 = performance.now();
    await s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" });
    const t4 = performance.now();
    if (i >= 3) {
      creates.push(t1 - t0);
      execs.push(t2 - t1);
      seconds.push(t4 - t3);
      cpu += (c.user + c.system) / 1000;
    }
    await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
  }
  console.log(`warm create p50 ${ms(stats(creates).p50)} ms, first exec p50 ${ms(stats(execs).p50)} ms, second exec p50 ${ms(stats(seconds).p50)} ms, control+client cpu/run ${ms(cpu / WARM_RUNS)} ms (n=${WARM_RUNS})`);
  await s.stop();
  log(`load average ${loadAvg()}`);
  process.exit(0);
}
try {
  const sb = await s.rest.ok("POST", "/sandbox", {});
  const dial = await s.server.server.sandboxes.manager.agentFor(sb.organizationId, sb.id);
  const { secret } = dial;
  const cg = await sandboxCgroup("/sys/fs/cgroup/cpuacct", sb.id);
  const sandboxNs = async () => (cg ? Number(await readFile(path.join(cg, "cpuacct.usage"), "utf8")) : NaN);
  if (UPLOAD_MIB > 0) {
    for (let round = 0; round < 3; round++) {
      const stop = round === 2 ? await startProfile("upload") : async () => undefined;
      const c0 = process.cpuUsage();
      const s0 = await sandboxNs();
      const t0 = performance.now();
      const client = await upload(s.url, s.key, sb.id, `/home/sandbar/up.bin`, UPLOAD_MIB);
      const secs = (performance.now() - t0) / 1000;
      const c = process.cpuUsage(c0);
      await stop();
      const gib = UPLOAD_MIB / 1024;
      const perGib = (us: number) => (us / 1e6 / gib).toFixed(2);
      console.log(
        `upload ${UPLOAD_MIB} MiB: ${((UPLOAD_MIB * MIB) / 1e6 / secs).toFixed(0)} MB/s  control cpu/GiB: user ${perGib(c.user)} sys ${perGib(c.system)} total ${perGib(c.user + c.system)} s  client ${perGib(client.user + client.system)} s  sandbox cpu/GiB: ${(((await sandboxNs()) - s0) / 1e9 / gib).toFixed(2)} s`,
      );
    }
    if (process.argv.includes("--download")) {
      for (let round = 0; round < 3; round++) {
        const c0 = process.cpuUsage();
        const s0 = await sandboxNs();
        const t0 = performance.now();
        const res = await fetch(`${s.url}/api/toolbox/${sb.id}/toolbox/files/download?path=${encodeURIComponent("/home/sandbar/up.bin")}`, { headers: { authorization: `Bearer ${s.key}` } });
        let bytes = 0;
        for await (const c of res.body!) bytes += (c as Uint8Array).length;
        const secs = (performance.now() - t0) / 1000;
        const c = process.cpuUsage(c0);
        if (res.status !== 200 || bytes !== UPLOAD_MIB * MIB) throw new Error(`download: ${res.status}, ${bytes} bytes`);
        const gib = UPLOAD_MIB / 1024;
        console.log(
          `download ${UPLOAD_MIB} MiB: ${((UPLOAD_MIB * MIB) / 1e6 / secs).toFixed(0)} MB/s  control+client cpu/GiB: user ${(c.user / 1e6 / gib).toFixed(2)} sys ${(c.system / 1e6 / gib).toFixed(2)} s  sandbox cpu/GiB: ${(((await sandboxNs()) - s0) / 1e9 / gib).toFixed(2)} s`,
        );
      }
    }
    await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
    process.exitCode = 0;
  } else {
  const agents = new AgentClients();
  const agent = agents.client(ProcessService, dial);
  const paths: [string, () => Promise<unknown>][] = [
    ["agent direct", () => agent.execute({ command: "true" }, { headers: { authorization: `Bearer ${secret}` } })],
    ["REST", () => s.rest.ok("POST", `/toolbox/${sb.id}/toolbox/process/execute`, { command: "true" })],
  ];
  for (const [, once] of paths) for (let i = 0; i < 50; i++) await once();
  for (let round = 0; round < 2; round++) {
    for (const [name, once] of paths) {
      const walls: number[] = [];
      const profiling = PROFILE_DIR && round === 1 && name === "REST" ? new Session() : undefined;
      if (profiling) {
        profiling.connect();
        await profiling.post("Profiler.enable");
        await profiling.post("Profiler.start");
      }
      const c0 = process.cpuUsage();
      const s0 = await sandboxNs();
      for (let i = 0; i < CALLS; i++) {
        const t0 = performance.now();
        await once();
        walls.push(performance.now() - t0);
      }
      const c = process.cpuUsage(c0);
      if (profiling) {
        const { profile } = await profiling.post("Profiler.stop");
        await mkdir(PROFILE_DIR!, { recursive: true });
        await writeFile(path.join(PROFILE_DIR!, "rest.cpuprofile"), JSON.stringify(profile));
        profiling.disconnect();
      }
      const sbUs = ((await sandboxNs()) - s0) / 1000 / CALLS;
      const st = stats(walls);
      console.log(
        `${name.padEnd(13)} n=${CALLS} p50=${ms(st.p50)} ms  control+client cpu/call: user ${ms(c.user / 1000 / CALLS)} sys ${ms(c.system / 1000 / CALLS)} ms  sandbox cpu/call: ${ms(sbUs / 1000)} ms`,
      );
    }
  }
  agents.close();
  await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
  }
} finally {
  await s.stop();
  log(`load average ${loadAvg()}`);
}
