import { readFile } from "node:fs/promises";
import type { CgroupBackend } from "./cgroups/types.ts";

// The sandbox's own processes as the host sees them: its init (pid 1 of the sandbox's pid
// namespace) and the agent the init supervises, both in the sandbox group's agent leaf.

/** The process's pid in each pid namespace it is in, outermost first (empty when it is gone). */
export async function nsPids(pid: number): Promise<number[]> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const m = /^NSpid:\s+(.*)$/m.exec(status);
  return m ? m[1].trim().split(/\s+/).map(Number) : [];
}

/** Host pid of the sandbox's init. */
export async function sandboxInit(cgroups: CgroupBackend, id: string): Promise<number | undefined> {
  for (const pid of await cgroups.agentPids(id)) {
    const ns = await nsPids(pid);
    if (ns.length > 1 && ns[ns.length - 1] === 1) return pid;
  }
  return undefined;
}

/** Host pid of the agent: the init's child running `node` (absent while the init waits to restart it). */
export async function sandboxAgent(cgroups: CgroupBackend, id: string, node: string): Promise<number | undefined> {
  const init = await sandboxInit(cgroups, id);
  if (init === undefined) return undefined;
  for (const pid of await cgroups.agentPids(id)) {
    const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
    if (Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]) !== init) continue;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmdline.startsWith(`${node}\0`)) return pid;
  }
  return undefined;
}
