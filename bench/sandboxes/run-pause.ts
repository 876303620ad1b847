// Pause and resume bench (DESIGN.md decision 20): the time of a pause and of a resume, on the
// provider and through the REST API, a toolbox call that resumes a paused sandbox, beside the
// freezer's own floor (freeze then thaw of a cgroup holding one process) measured in the same run,
// interleaved; and the host memory an idle paused sandbox keeps.
//
//   node bench/sandboxes/run-pause.ts [--quick]   (as root; writes bench/sandboxes/RESULTS-pause.md)
//
// --quick: 12 runs of each (to check the bench works).
import { spawn } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { detectCgroups } from "../../packages/runner/src/linux/cgroups/detect.ts";
import { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { LinuxProvider } from "../../packages/runner/src/linux/provider.ts";
import { loadAvg, log, machine, ms, requireRoot, startBenchServer, stats } from "./support.ts";

requireRoot("bench/sandboxes/run-pause");
const QUICK = process.argv.includes("--quick");
const RUNS = QUICK ? 12 : 50;
const MEMORY_SANDBOXES = QUICK ? 3 : 10;
/** Paused sandboxes started for the density figure (host-wide MemAvailable before and after). */
const DENSITY = QUICK ? 20 : 200;
const MiB = 2 ** 20;

const now = () => performance.now();
async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = now();
  await fn();
  return now() - t0;
}

const b = await startBenchServer({ warmPool: 0 });
const runtime = b.server.server.sandboxes.runtime;
if (!(runtime instanceof LocalRuntime) || !(runtime.provider instanceof LinuxProvider)) throw new Error("the pause bench needs the local runtime's linux provider");
const provider = runtime.provider;
const rows: Array<[string, number[]]> = [];
const series = (name: string) => {
  const xs: number[] = [];
  rows.push([name, xs]);
  return xs;
};

// The floor: the same cgroup back end freezing and thawing a group that holds one sleeping process.
const floorGroup = `bench-freeze-${process.pid}`;
const cgroups = await detectCgroups({ group: "sandbar-bench-pause" });
await cgroups.create(floorGroup, { memoryBytes: 64 * MiB, pidsMax: 16, cpuQuotaUs: 100_000, cpuPeriodUs: 100_000 });
const sleeper = spawn("/bin/sh", ["-c", `echo $$ | tee ${cgroups.procsFiles(floorGroup).join(" ")} >/dev/null && exec sleep 3600`], { stdio: "ignore" });
while ((await cgroups.pids(floorGroup)).length === 0) await new Promise((r) => setTimeout(r, 5));

try {
  const create = async (body: Record<string, unknown> = {}) => (await b.rest.ok("POST", "/sandbox", { autoStopInterval: 0, ...body })).id as string;
  const id = await create();
  const viaApi = await create();
  const auto = await create();
  const exec = (sid: string) => b.rest.ok("POST", `/toolbox/${sid}/toolbox/process/execute`, { command: "true" });
  for (const sid of [id, viaApi, auto]) await exec(sid); // every agent warm

  const floorFreeze = series("floor: cgroup freeze (1 process)");
  const floorThaw = series("floor: cgroup thaw");
  const floorBoth = series("floor: freeze + thaw");
  const pPause = series("provider pause (freeze + reclaim)");
  const pResume = series("provider resume (thaw)");
  const rPause = series("REST POST /sandbox/{id}/pause");
  const rResume = series("REST POST /sandbox/{id}/start (resume)");
  const execStarted = series("toolbox execute `true`, sandbox started");
  const execPaused = series("toolbox execute `true`, sandbox paused (auto-resume)");
  for (let i = 0; i < RUNS; i++) {
    const f = await timed(() => cgroups.freeze(floorGroup));
    const t = await timed(() => cgroups.thaw(floorGroup));
    floorFreeze.push(f);
    floorThaw.push(t);
    floorBoth.push(f + t);
    pPause.push(await timed(() => provider.pause(id)));
    pResume.push(await timed(() => provider.resume(id)));
    rPause.push(await timed(() => b.rest.ok("POST", `/sandbox/${viaApi}/pause`)));
    rResume.push(await timed(() => b.rest.ok("POST", `/sandbox/${viaApi}/start`)));
    execStarted.push(await timed(() => exec(auto)));
    await b.rest.ok("POST", `/sandbox/${auto}/pause`);
    execPaused.push(await timed(() => exec(auto)));
  }

  // Host memory of idle paused sandboxes (the agent and its init, nothing of the user's).
  const idle = await Promise.all(Array.from({ length: MEMORY_SANDBOXES }, () => create()));
  for (const sid of idle) await exec(sid);
  const resident: number[] = [];
  const reclaimed: number[] = [];
  const runningBytes: number[] = [];
  for (const sid of idle) {
    runningBytes.push((await provider.inspect(sid)).usage?.memoryBytes ?? 0);
    const p = (await provider.pause(sid)).paused!;
    resident.push(p.residentBytes);
    reclaimed.push(p.reclaimedBytes ?? 0);
  }
  const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / xs.length;
  for (const sid of [id, viaApi, auto, ...idle]) await b.rest.call("DELETE", `/sandbox/${sid}`);

  // Density, measured on the host: MemAvailable before and after DENSITY sandboxes made and paused
  // through the API (everything they cost the host: agents, mounts, loop devices, page tables).
  const available = async () => Number(/^MemAvailable:\s+(\d+) kB/m.exec(await readFile("/proc/meminfo", "utf8"))![1]) * 1024;
  const availableBefore = await available();
  const dense: string[] = [];
  for (let i = 0; i < DENSITY; i++) {
    const sid = await create();
    await exec(sid);
    await b.rest.ok("POST", `/sandbox/${sid}/pause`);
    dense.push(sid);
  }
  const perDense = (availableBefore - (await available())) / DENSITY;
  for (const sid of dense) await b.rest.call("DELETE", `/sandbox/${sid}`);

  const table = rows.map(([name, xs]) => {
    const s = stats(xs);
    return `| ${name} | ${s.n} | ${ms(s.p50)} | ${ms(s.p95)} | ${ms(s.mean)} |`;
  });
  const floor = stats(floorBoth);
  const ratio = (xs: number[]) => `${(stats(xs).p50 / floor.p50).toFixed(1)}×`;
  const target = (xs: number[], limit: number) => `${stats(xs).p50 <= limit ? "met" : "missed"} (≤ ${limit} ms)`;
  const perPaused = mean(resident);
  const text = `# Sandboxes bench: pause and resume

Latest run: ${new Date().toISOString()} on ${machine()}, cgroup ${cgroups.version};
load average at the end ${loadAvg()} (the machine is shared: other work running at the same time shows up as noise).

Command: \`node bench/sandboxes/run-pause.ts\` (as root). One real control server (\`startTestServer\`, the real
agent bundled fresh, no warm pool); three idle sandboxes of the default shape (1 core, 1 GiB). The kinds of
run are interleaved, ${RUNS} of each, so load drifting on the machine hits them alike.

- **floor**: the cgroup back end's own freeze and thaw (packages/runner/src/linux/cgroups) of a group
  holding one \`sleep\`: write the freezer state, poll until the kernel says FROZEN (1 ms apart).
- **provider pause / resume**: \`LinuxProvider.pause\` (freeze of the sandbox group, both leaves, then the
  memory reclaim) and \`resume\` (thaw), each answering the sandbox's info.
- **REST pause / resume**: \`POST /api/sandbox/{id}/pause\` and \`POST /api/sandbox/{id}/start\` of a paused
  sandbox, HTTP/1.1 keep-alive: the state written twice each (pausing, paused; resuming, started) and events.
- **toolbox execute, paused**: \`POST /api/toolbox/{id}/toolbox/process/execute {"command":"true"}\` on a
  paused sandbox: the toolbox's lookup resumes it (auto-resume), then the call runs; beside the same call
  on the started sandbox.

| what | runs | p50 ms | p95 ms | mean ms |
|---|---|---|---|---|
${table.join("\n")}

Against the floor (freeze + thaw, p50 ${ms(floor.p50)} ms) and the issue's targets:

| what | p50 / floor | target |
|---|---|---|
| provider pause | ${ratio(pPause)} | ${target(pPause, 50)} |
| provider resume | ${ratio(pResume)} | ${target(pResume, 20)} |
| REST pause | ${ratio(rPause)} | ${target(rPause, 50)} |
| REST resume | ${ratio(rResume)} | ${target(rResume, 20)} |

Host memory of ${MEMORY_SANDBOXES} idle paused sandboxes (the real agent idle, nothing of the user's), from the
sandbox group's memory.usage_in_bytes: ${(mean(runningBytes) / MiB).toFixed(1)} MiB each while running,
${(mean(reclaimed) / MiB).toFixed(1)} MiB reclaimed by the pause, **${(perPaused / MiB).toFixed(1)} MiB resident
while paused**. On this cgroup ${cgroups.version} host without swap only page cache can be reclaimed: the
agent's anonymous memory stays, so ${Math.floor((os.totalmem() * 0.9) / perPaused)} paused idle sandboxes would fit in 90% of
this machine's ${Math.round(os.totalmem() / 2 ** 30)} GiB by memory alone (the issue's target is 1,000).

Density measured on the host: ${DENSITY} sandboxes made and paused through the API took
**${(perDense / MiB).toFixed(1)} MiB of MemAvailable each** (agent, init, mounts, loop devices, kernel objects);
at that rate the ${(availableBefore / 2 ** 30).toFixed(1)} GiB available before them hold
**${Math.floor(availableBefore / perDense)} paused sandboxes** (target 1,000: ${availableBefore / perDense >= 1000 ? "met" : "missed"}).
`;
  await writeFile(path.join(import.meta.dirname, "RESULTS-pause.md"), text);
  console.log(text);
} finally {
  sleeper.kill("SIGKILL");
  await cgroups.thaw(floorGroup).catch(() => undefined);
  await cgroups.kill(floorGroup).catch(() => undefined);
  await cgroups.remove(floorGroup).catch((err: unknown) => log(`floor cgroup: ${String(err)}`));
  await cgroups.removeParentIfEmpty();
  await b.stop();
}
