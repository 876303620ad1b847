import { access, readdir, readFile } from "node:fs/promises";
import type { LocalRuntime } from "../local-runtime.ts";

// What a destroyed sandbox must not leave on the host: mounts, cgroups, processes, directories,
// loop devices. Empty when clean.

const exists = (p: string) => access(p).then(() => true, () => false);

async function mountPoints(): Promise<string[]> {
  const text = await readFile("/proc/self/mountinfo", "utf8");
  return text.split("\n").filter(Boolean).map((l) => l.split(" ")[4].replace(/\\040/g, " "));
}

/** Pids of host processes whose real uid is in [from, to). */
export async function processesOfUids(from: number, to: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const status = await readFile(`/proc/${name}/status`, "utf8").catch(() => "");
    const m = /^Uid:\s+(\d+)/m.exec(status);
    if (m && Number(m[1]) >= from && Number(m[1]) < to) out.push(Number(name));
  }
  return out;
}

export async function leftovers(runtime: LocalRuntime, id: string, hostUid: number): Promise<string[]> {
  const { layout, cgroups } = runtime.provider;
  const found: string[] = [];
  const dirs = [layout.sandboxDir(id), layout.runtime(id)];
  for (const m of await mountPoints()) if (dirs.some((d) => m === d || m.startsWith(d + "/"))) found.push(`mount ${m}`);
  for (const d of cgroups.paths(id)) if (await exists(d)) found.push(`cgroup ${d}`);
  for (const pid of await processesOfUids(hostUid, hostUid + 1)) found.push(`process ${pid}`);
  for (const d of dirs) if (await exists(d)) found.push(`directory ${d}`);
  for (const dev of await readdir("/sys/block").catch(() => [] as string[])) {
    if (!dev.startsWith("loop")) continue;
    const backing = await readFile(`/sys/block/${dev}/loop/backing_file`, "utf8").catch(() => "");
    if (backing.startsWith(layout.sandboxDir(id) + "/")) found.push(`loop device ${dev} -> ${backing.trim()}`);
  }
  return found;
}

/** Everything the runner holds on the host (for whole-runner leak checks). */
export async function runnerLeftovers(runtime: LocalRuntime): Promise<string[]> {
  const { layout } = runtime.provider;
  const found: string[] = [];
  for (const m of await mountPoints()) if (m.startsWith(layout.runtimeDir + "/") || m.startsWith(layout.sandboxesDir + "/")) found.push(`mount ${m}`);
  for (const d of await readdir(layout.sandboxesDir).catch(() => [] as string[])) found.push(`sandbox dir ${d}`);
  for (const d of await readdir(layout.runtimeDir).catch(() => [] as string[])) found.push(`runtime dir ${d}`);
  return found;
}
