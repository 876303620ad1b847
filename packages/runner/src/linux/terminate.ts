import { access } from "node:fs/promises";
import type { CgroupBackend } from "./cgroups/types.ts";
import { signalAll, sleep } from "./cgroups/types.ts";
import { nsPids, sandboxInit } from "./sandbox-procs.ts";

// Ends every process of a sandbox, in an order that leaves no zombie behind.
//
// A sandbox's group holds the outer bwrap (host pid namespace) and everything in the sandbox's
// own pid namespace, whose init is a shell supervising the agent. The namespace goes first
// (SIGTERM to the init when graceful, which it forwards to the agent and exits after it; then
// SIGKILL, and killing the init takes the whole namespace down). The outer bwrap then reaps the
// init and exits, and its parent (the runner, or pid 1 for a sandbox adopted after a runner
// restart) reaps it. Killing the outer bwrap first would orphan the init to the host's pid 1.

/** Pids of the group inside the sandbox's own pid namespace. */
async function innerPids(cgroups: CgroupBackend, id: string): Promise<number[]> {
  const out: number[] = [];
  for (const pid of await cgroups.pids(id)) if ((await nsPids(pid)).length > 1) out.push(pid);
  return out;
}

async function until(cond: () => Promise<boolean>, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (let i = 0; ; i++) {
    if (await cond()) return true;
    if (Date.now() > deadline) return false;
    await sleep(i < 50 ? 2 : 10);
  }
}

const gone = async (pid: number) => access(`/proc/${pid}`).then(() => false, () => true);

export async function endSandboxProcesses(cgroups: CgroupBackend, id: string, graceMs: number): Promise<void> {
  const seen = new Set(await cgroups.pids(id));
  if (seen.size === 0) return;
  const empty = async () => (await cgroups.pids(id)).length === 0;
  if (graceMs > 0) {
    // SIGTERM to the init only: it forwards it to the agent, which ends its sessions and
    // terminals politely and exits; the init follows and the namespace goes with it.
    const init = await sandboxInit(cgroups, id);
    signalAll(init === undefined ? await innerPids(cgroups, id) : [init], "SIGTERM");
    await until(empty, graceMs);
  }
  await until(async () => {
    const inner = await innerPids(cgroups, id);
    for (const p of inner) seen.add(p);
    signalAll(inner, "SIGKILL");
    return inner.length === 0;
  }, 2000);
  await until(empty, 2000); // the outer bwrap exits once its child is gone
  for (const p of await cgroups.pids(id)) seen.add(p);
  await cgroups.kill(id);
  // Wait for the reaping, so a finished stop leaves not even a zombie.
  await until(async () => (await Promise.all([...seen].map(gone))).every(Boolean), 2000);
}
