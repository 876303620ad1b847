import { setTimeout } from "node:timers/promises";
import type { CallOptions, Client } from "@connectrpc/connect";
import type { ExecuteResponse, LogChunk, ProcessService, Session, SessionExecuteResponse } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";

export interface ExecOptions extends CallOptions {
  cwd?: string;
  env?: Record<string, string>;
  /** Seconds the command may run (the agent's default when unset). */
  timeout?: number;
}

/** Commands in one sandbox: one-shot `exec`, and sessions whose commands' output can be followed. */
export class Processes {
  /** The generated ProcessService client for this sandbox (code run, session details). */
  readonly client: Client<typeof ProcessService>;

  constructor(client: Client<typeof ProcessService>) {
    this.client = client;
  }

  /** Runs `command` in a shell to its end; stdout and stderr together in `result`. */
  exec(command: string, o: ExecOptions = {}): Promise<ExecuteResponse> {
    const { cwd, env, timeout, ...opts } = o;
    return this.client.execute({ command, cwd, envs: env, timeout }, opts);
  }

  /**
   * Kills every process the sandbox runs for the user (a fork bomb too) at once; sessions get a
   * new shell. Answers how many there were, once they are gone.
   */
  async killAll(opts?: CallOptions): Promise<number> {
    return (await this.client.killAllProcesses({}, opts)).killed;
  }

  async createSession(sessionId: string, opts?: CallOptions): Promise<void> {
    await this.client.createSession({ sessionId }, opts);
  }

  async listSessions(opts?: CallOptions): Promise<Session[]> {
    return (await this.client.listSessions({}, opts)).sessions;
  }

  getSession(sessionId: string, opts?: CallOptions): Promise<Session> {
    return this.client.getSession({ sessionId }, opts);
  }

  async deleteSession(sessionId: string, opts?: CallOptions): Promise<void> {
    await this.client.deleteSession({ sessionId }, opts);
  }

  /**
   * Runs `command` in the session. Synchronous by default (answers with its exit code and output);
   * `async: true` answers at once with `cmdId`, for logs() to follow.
   */
  sessionExec(sessionId: string, command: string, o: { async?: boolean } & CallOptions = {}): Promise<SessionExecuteResponse> {
    const { async = false, ...opts } = o;
    return this.client.sessionExecute({ sessionId, command, runAsync: async }, opts);
  }

  /**
   * The command's output as chunks (`chunk.data.case` is "stdout" or "stderr"): what it wrote so far
   * and, with `follow` (default), what it writes until it ends.
   */
  logs(sessionId: string, commandId: string, o: { follow?: boolean } & CallOptions = {}): AsyncIterable<LogChunk> {
    const { follow = true, ...opts } = o;
    return this.client.streamSessionCommandLogs({ sessionId, commandId, follow }, opts);
  }

  /**
   * Runs `command` in a session of its own, handing its output over as it is written (for a CLI's
   * `exec`), and answers its exit code. The session is deleted afterwards, which ends the command
   * if the call was aborted.
   */
  async run(command: string, o: { onStdout?: (data: Uint8Array) => void; onStderr?: (data: Uint8Array) => void } & CallOptions = {}): Promise<{ exitCode: number }> {
    const { onStdout, onStderr, ...opts } = o;
    const sessionId = `run-${crypto.randomUUID()}`;
    await this.createSession(sessionId, opts);
    try {
      const { cmdId } = await this.sessionExec(sessionId, command, { ...opts, async: true });
      for await (const chunk of this.logs(sessionId, cmdId, opts)) {
        if (chunk.data.case === "stdout") onStdout?.(chunk.data.value);
        else if (chunk.data.case === "stderr") onStderr?.(chunk.data.value);
      }
      // The log ends when the command does; its exit code may land a moment later.
      for (let delay = 10; ; delay = Math.min(200, delay * 2)) {
        const cmd = await this.client.getSessionCommand({ sessionId, commandId: cmdId }, opts);
        if (cmd.exitCode !== undefined) return { exitCode: cmd.exitCode };
        await setTimeout(delay, undefined, { signal: opts.signal });
      }
    } finally {
      await this.deleteSession(sessionId).catch(() => undefined);
    }
  }

  /** Sends a line to the command's stdin (a newline is added when missing). */
  async sendInput(sessionId: string, commandId: string, data: string, opts?: CallOptions): Promise<void> {
    await this.client.sendSessionCommandInput({ sessionId, commandId, data }, opts);
  }
}
