import { existsSync, readdirSync, readFileSync } from "node:fs";

/** Parent pid of every process, read from /proc. */
function parentsByPid(): Map<number, number> {
  const parents = new Map<number, number>();
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return parents;
  }
  for (const e of entries) {
    const pid = Number(e);
    if (!Number.isInteger(pid)) continue;
    try {
      // The command name (field 2) is in parentheses and may contain spaces.
      const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
      const after = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      parents.set(pid, Number(after[1]));
    } catch {
      // Gone meanwhile.
    }
  }
  return parents;
}

/** Whether the kernel has /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN); known on first use. */
let childrenFiles: boolean | undefined;

/** The children of every thread of pid (none once it is gone). */
function childrenOf(pid: number): number[] {
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const tid of tids) {
    let text = "";
    try {
      text = readFileSync(`/proc/${pid}/task/${tid}/children`, "latin1");
    } catch {
      // The thread exited meanwhile.
    }
    for (const c of text.split(" ")) if (/^\d+$/.test(c)) out.push(Number(c));
  }
  return out;
}

/**
 * Every live descendant of pid (children first found first). Walked down from pid through the
 * children files where the kernel has them: what it reads grows with the tree, not with every
 * process there is (a whole /proc scan blocked the agent for seconds under a fork bomb).
 */
export function descendants(pid: number): number[] {
  childrenFiles ??= existsSync(`/proc/self/task/${process.pid}/children`);
  if (childrenFiles) {
    const out: number[] = [];
    const queue = [pid];
    while (queue.length > 0) {
      for (const c of childrenOf(queue.shift()!)) {
        out.push(c);
        queue.push(c);
      }
    }
    return out;
  }
  const parents = parentsByPid();
  const children = new Map<number, number[]>();
  for (const [child, parent] of parents) {
    const list = children.get(parent);
    if (list) list.push(child);
    else children.set(parent, [child]);
  }
  const out: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    const p = queue.shift()!;
    for (const c of children.get(p) ?? []) {
      out.push(c);
      queue.push(c);
    }
  }
  return out;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // Already gone.
  }
}

/** Signals a process group led by pid, then every descendant that left the group. */
export function signalTree(pid: number, sig: NodeJS.Signals): void {
  const tree = descendants(pid);
  signal(-pid, sig);
  signal(pid, sig);
  for (const d of tree) signal(d, sig);
}

/** Running, not a zombie waiting to be reaped. */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return stat[stat.lastIndexOf(")") + 2] !== "Z";
  } catch {
    return false;
  }
}

/**
 * Ends pid and all its descendants: SIGTERM, then SIGKILL for whatever is
 * still there after the grace period.
 */
export async function terminateTree(pid: number, graceMs = 5000, checkMs = 100): Promise<void> {
  const tree = [pid, ...descendants(pid)];
  signalTree(pid, "SIGTERM");
  for (const d of tree) signal(d, "SIGTERM");
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline) {
    if (!tree.some(alive)) return;
    await new Promise((r) => setTimeout(r, checkMs));
  }
  signalTree(pid, "SIGKILL");
  for (const d of tree) signal(d, "SIGKILL");
}
