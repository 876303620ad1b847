import { constants as fsConstants } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import { open, stat } from "node:fs/promises";
import net from "node:net";

// What the host sees of a sandbox's agent, whoever made the sandbox: whether its socket accepts,
// and how often the supervising init (init-script.ts) restarted it.

/** Whether `socket` accepts a connection now (a connect that hangs past `timeoutMs` is "refused"). */
export async function accepts(socket: string, timeoutMs = 5000): Promise<"absent" | "refused" | "accepting"> {
  try {
    if (!(await stat(socket)).isSocket()) return "absent";
  } catch {
    return "absent";
  }
  return new Promise((resolve) => {
    const s = net.connect(socket);
    const timer = setTimeout(() => {
      s.destroy();
      resolve("refused");
    }, timeoutMs);
    s.once("connect", () => {
      clearTimeout(timer);
      s.destroy();
      resolve("accepting");
    });
    s.once("error", () => {
      clearTimeout(timer);
      resolve("refused");
    });
  });
}

export interface AgentRestarts {
  count: number;
  /** When the last restart was counted. */
  at?: Date;
  /** The exit status of the agent that was restarted last (> 128: killed by signal - 128). */
  lastStatus?: number;
}

/**
 * The supervising init's count of agent restarts ("<count> <last status>"). The sandbox uid owns
 * the directory: only a small regular file is read, never through a link (nor a FIFO's block).
 */
export async function readRestarts(file: string): Promise<AgentRestarts> {
  let fh: FileHandle | undefined;
  try {
    fh = await open(file, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
    const st = await fh.stat();
    if (!st.isFile()) return { count: 0 };
    const buf = Buffer.alloc(64);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    const [count, status] = buf.subarray(0, bytesRead).toString().trim().split(/\s+/).map(Number);
    if (!Number.isSafeInteger(count) || count <= 0) return { count: 0 };
    return Number.isSafeInteger(status) ? { count, at: st.mtime, lastStatus: status } : { count, at: st.mtime };
  } catch {
    return { count: 0 };
  } finally {
    await fh?.close();
  }
}

