import { readdirSync } from "node:fs";
import { errors } from "@sandbar/protocol";
import type { AgentContext } from "../context.ts";

/** How long the processes get to be gone (reaped) before the call answers anyway. */
const GONE_WITHIN_MS = 10_000;
const POLL_MS = 10;

/** Pids in this pid namespace but its init (1) and this process. */
function others(): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    const pid = Number(name);
    if (Number.isInteger(pid) && pid > 1 && pid !== process.pid) out.push(pid);
  }
  return out;
}

/**
 * SIGKILLs every process of the sandbox but the agent and the init, and waits until they are
 * gone; answers how many there were.
 *
 * kill(2) with pid -1 signals every process the caller may signal (in a sandbox: every other
 * process, all run as the sandbox's uid) except itself and its pid namespace's init, while the
 * kernel holds its task list: a fork under way either finished before (its child is signalled
 * too) or is abandoned (a parent with a fatal signal pending gets no child). So a fork bomb cannot
 * refill while it is killed, which a loop over the user cgroup's pids could not promise without
 * freezing it first; and it needs no cgroup file, on v1, v2 or Docker alike. The agent's own
 * helpers (a mkfifo under way) go too: they were working for calls on the user's processes.
 */
export async function killAllProcesses(ctx: AgentContext): Promise<number> {
  // Anywhere else pid -1 would be every process of the caller's user on the host.
  if (!ctx.sandboxed) throw errors.failedPrecondition("killing every process is only done in a sandbox (the agent runs under its init, as pid 1's child)");
  const before = others();
  process.kill(-1, "SIGKILL");
  // Gone once reaped: the agent's children by the agent (its event loop runs meanwhile), orphans by the init.
  let left = before;
  for (const deadline = Date.now() + GONE_WITHIN_MS; left.length > 0 && Date.now() < deadline; ) {
    await new Promise((r) => setTimeout(r, POLL_MS));
    const now = new Set(others());
    left = left.filter((p) => now.has(p));
  }
  if (left.length > 0) ctx.log(`kill-all: ${left.length} process(es) still there after ${GONE_WITHIN_MS} ms`);
  return before.length;
}
