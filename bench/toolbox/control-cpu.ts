// Control's own CPU per exec call, REST and gRPC, beside the agent called directly: the clients
// run in a worker thread, and the control process's CPU is read from /proc (schedstat, ns) for
// every thread but the worker's, so the figure is the server's alone (its event loop, GC and
// libuv threads; not the embedded PostgreSQL, which is a process of its own).
//
//   node bench/toolbox/control-cpu.ts [calls per round] [rounds] [--only <path>] [--profile <file>]
//
// (as root; prints only.) --only: that path alone ("REST", "gRPC"); --profile: a CPU profile of
// the control process's main thread over the measured rounds, as <file> (.cpuprofile).
//
// Paths interleave in rounds so drifting load hits them alike; figures are medians over rounds.
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { Session } from "node:inspector/promises";
import { connect } from "node:net";
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { AgentClients } from "../../packages/control/src/toolbox/agent-clients.ts";
import { loadAvg, log, ms, requireRoot, Rest, startBenchServer, stats } from "../sandboxes/support.ts";

interface Job {
  url: string;
  key: string;
  id: string;
  socket: string;
  secret: string;
  calls: number;
  rounds: number;
  only?: string;
}

const arg = (name: string) => (process.argv.indexOf(name) > 0 ? process.argv[process.argv.indexOf(name) + 1] : undefined);

if (isMainThread) {
  requireRoot("bench/toolbox/control-cpu");
  const calls = Number(process.argv[2] ?? 200) || 200;
  const rounds = Number(process.argv[3] ?? 5) || 5;
  const s = await startBenchServer();
  try {
    const sb = await s.rest.ok("POST", "/sandbox", {});
    const dial = await s.server.server.sandboxes.manager.agentFor(sb.organizationId, sb.id);
    const job: Job = { url: s.url, key: s.key, id: sb.id, socket: dial.key, secret: dial.secret, calls, rounds, only: arg("--only") };
    const profile = arg("--profile");
    const session = profile ? new Session() : undefined;
    const worker = new Worker(new URL(import.meta.url), { workerData: job });
    const lines = await new Promise<string[]>((resolve, reject) => {
      worker.on("message", (m: string[] | "measuring") => {
        if (m !== "measuring") return resolve(m);
        if (!session) return;
        session.connect();
        void session.post("Profiler.enable").then(() => session.post("Profiler.start"));
      });
      worker.once("error", reject);
    });
    if (session) {
      const { profile: taken } = await session.post("Profiler.stop");
      await writeFile(profile!, JSON.stringify(taken));
      session.disconnect();
    }
    for (const line of lines) console.log(line);
    await worker.terminate();
    await s.rest.ok("DELETE", `/sandbox/${sb.id}`);
  } finally {
    await s.stop();
    log(`load average ${loadAvg()}`);
  }
} else {
  const job = workerData as Job;
  const self = readlinkSync("/proc/thread-self").split("/").pop();
  /** CPU ns of every thread of this process but this one. */
  const controlNs = () => {
    let ns = 0;
    for (const tid of readdirSync("/proc/self/task")) {
      if (tid === self) continue;
      try {
        ns += Number(readFileSync(`/proc/self/task/${tid}/schedstat`, "utf8").split(" ")[0]);
      } catch {
        // a thread that ended meanwhile
      }
    }
    return ns;
  };
  const rest = new Rest(job.url, job.key);
  const headers: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${job.key}`);
    req.header.set("x-sandbar-sandbox-id", job.id);
    return next(req);
  };
  const control = createClient(ProcessService, createGrpcTransport({ baseUrl: job.url, interceptors: [headers] }));
  const agents = new AgentClients();
  const agent = agents.client(ProcessService, { key: job.socket, api: () => connect(job.socket) });
  const check = (r: { exitCode: number }) => {
    if (r.exitCode !== 0) throw new Error(`exec exited ${r.exitCode}`);
  };
  const all: [string, () => Promise<void>][] = [
    ["agent direct", async () => check(await agent.execute({ command: "true" }, { headers: { authorization: `Bearer ${job.secret}` } }))],
    ["REST", async () => check(await rest.ok("POST", `/toolbox/${job.id}/toolbox/process/execute`, { command: "true" }))],
    ["gRPC (control)", async () => check(await control.execute({ command: "true" }))],
  ];
  const paths = all.filter(([name]) => !job.only || name === "agent direct" || name.startsWith(job.only));
  for (const [, once] of paths) for (let i = 0; i < 50; i++) await once();
  parentPort!.postMessage("measuring");
  await new Promise((r) => setTimeout(r, 50));
  const cpu = new Map<string, number[]>(paths.map(([n]) => [n, []]));
  const p50 = new Map<string, number[]>(paths.map(([n]) => [n, []]));
  for (let round = 0; round < job.rounds; round++) {
    for (const [name, once] of paths) {
      const walls: number[] = [];
      const c0 = controlNs();
      for (let i = 0; i < job.calls; i++) {
        const t0 = performance.now();
        await once();
        walls.push(performance.now() - t0);
      }
      cpu.get(name)!.push((controlNs() - c0) / 1e6 / job.calls);
      p50.get(name)!.push(stats(walls).p50);
    }
  }
  const med = (xs: number[]) => stats(xs).p50;
  const direct = med(p50.get("agent direct")!);
  const lines = paths.map(([name]) => {
    const p = med(p50.get(name)!);
    return `${name.padEnd(15)} control cpu/call ${ms(med(cpu.get(name)!))} ms (min ${ms(Math.min(...cpu.get(name)!))}; rounds ${cpu.get(name)!.map(ms).join(" ")})  p50 ${ms(p)} ms  over direct ${ms(p - direct)} ms`;
  });
  agents.close();
  rest.close();
  parentPort!.postMessage(lines);
}
