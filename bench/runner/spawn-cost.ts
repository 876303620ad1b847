// What a spawn costs the runner: from this process (as large as a control server: `ballast` MB
// of heap) against through the runner's spawner process (packages/runner/src/host/spawner.ts),
// interleaved. Wall time of `mount --version` (an exec like the start path's) start to close,
// and the CPU time of this process plus the spawner's per spawn (not the command's own: it is
// the same both ways). Usage: node bench/runner/spawn-cost.ts [runs=200] [ballastMB=200]
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { readySpawner } from "../../packages/runner/src/host/spawner.ts";
import { stats } from "../sandboxes/support.ts";

const runs = Number(process.argv[2] ?? 200);
const ballastMB = Number(process.argv[3] ?? 200);
const ballast: unknown[] = [];
for (let i = 0; i < ballastMB; i++) ballast.push(Buffer.alloc(2 ** 19, i), Array.from({ length: 8000 }, (_, j) => ({ i, j })));

const helper = await readySpawner();
if (!helper?.pid) throw new Error("the spawner did not start");
const ticks = (pid: number) => {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) * 10; // utime + stime, in ms (USER_HZ 100)
};
const here = () =>
  new Promise<void>((resolve, reject) => {
    const c = spawn("mount", ["--version"], { stdio: ["ignore", "pipe", "pipe"] });
    c.stdout.resume();
    c.stderr.resume();
    c.on("error", reject);
    c.on("close", () => resolve());
  });
const viaHelper = async () => void (await helper.run({ cmd: "mount", args: ["--version"], env: process.env }));

const sides = { here: { f: here, wall: [] as number[], cpu: 0 }, spawner: { f: viaHelper, wall: [] as number[], cpu: 0 } };
for (let i = 0; i < runs + 10; i++) {
  for (const s of i % 2 ? [sides.spawner, sides.here] : [sides.here, sides.spawner]) {
    const c0 = process.cpuUsage();
    const h0 = ticks(helper.pid);
    const t = performance.now();
    await s.f();
    const wall = performance.now() - t;
    const c = process.cpuUsage(c0);
    if (i < 10) continue; // warm-up
    s.wall.push(wall);
    s.cpu += (c.user + c.system) / 1000 + (ticks(helper.pid) - h0);
  }
}
console.log(`${runs} spawns each, interleaved; this process: ${(process.memoryUsage().rss / 2 ** 20).toFixed(0)} MB RSS; spawner: ${(Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${helper.pid}/status`, "utf8"))![1]) / 1024).toFixed(0)} MB RSS`);
console.log("| from | wall p50 ms | wall p95 ms | CPU ms per spawn (this process + spawner) |");
for (const [name, s] of Object.entries(sides)) {
  const st = stats(s.wall);
  console.log(`| ${name} | ${st.p50.toFixed(2)} | ${st.p95.toFixed(2)} | ${(s.cpu / runs).toFixed(2)} |`);
}
void ballast.length;
