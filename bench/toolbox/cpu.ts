// CPU cost of one exec call on each hop, for profiling on a shared machine (wall-clock p50s move
// with the neighbours' load; CPU time per call much less): the control process's own CPU
// (process.cpuUsage, which includes the bench's clients) and the sandbox's (its cpuacct cgroup:
// the agent, its shells and the user cgroup), per call, beside the wall-clock p50.
//
//   node bench/toolbox/cpu.ts [calls] [--profile <dir>]     (as root; prints, writes nothing else)
//
// --profile: a CPU profile of this process (control server and clients) over the REST calls
// of the second round only (no start-up, no warm-up), as <dir>/rest.cpuprofile.
import { mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import { Session } from "node:inspector/promises";
import * as path from "node:path";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { AgentClients } from "../../packages/control/src/toolbox/agent-clients.ts";
import { loadAvg, log, ms, requireRoot, startBenchServer, stats } from "../sandboxes/support.ts";

requireRoot("bench/toolbox/cpu");
const CALLS = Number(process.argv[2] ?? 300) || 300;
const profileAt = process.argv.indexOf("--profile");
const PROFILE_DIR = profileAt > 0 ? process.argv[profileAt + 1] : undefined;

async function findCgroup(root: string, id: string, depth = 3): Promise<string | undefined> {
  if (depth === 0) return undefined;
  for (const e of await readdir(root, { withFileTypes: true }).catch(() => [])) {
    if (!e.isDirectory()) continue;
    const p = path.join(root, e.name);
    if (e.name.includes(id)) return p;
    const deeper = await findCgroup(p, id, depth - 1);
    if (deeper) return deeper;
  }
  return undefined;
}

const s = await startBenchServer({ warmPool: 0 });
try {
  const sb = await s.rest.ok("POST", "/sandbox", {});
  const { socket, secret } = await s.server.server.sandboxes.manager.agentFor(sb.organizationId, sb.id);
  const cg = await findCgroup("/sys/fs/cgroup/cpuacct", sb.id);
  const sandboxNs = async () => (cg ? Number(await readFile(path.join(cg, "cpuacct.usage"), "utf8")) : NaN);
  const agents = new AgentClients();
  const agent = agents.client(ProcessService, socket);
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
} finally {
  await s.stop();
  log(`load average ${loadAvg()}`);
}
