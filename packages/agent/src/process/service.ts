import type { ServiceImpl } from "@connectrpc/connect";
import type { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { errors } from "@sandbar/protocol";
import type { AgentContext } from "../context.ts";
import { readLog } from "../sessions/command-log.ts";
import type { SessionManager } from "../sessions/manager.ts";
import { ChunkCollector } from "../sessions/output.ts";
import type { Session, SessionCommand } from "../sessions/session.ts";
import { STDOUT } from "../sessions/command-log.ts";
import { codeRun } from "./code-run.ts";
import { execute } from "./execute.ts";
import { killAllProcesses } from "./kill-all.ts";
import { ShellLauncher } from "./launcher.ts";

function sessionView(s: Session) {
  return {
    sessionId: s.id,
    commands: [...s.commands.values()].map(commandView),
  };
}

function commandView(c: SessionCommand) {
  return { id: c.id, command: c.command, exitCode: c.exitCode };
}

/** A command's whole log as typed chunks. */
async function collect(command: SessionCommand) {
  const out = new ChunkCollector();
  for await (const rec of readLog(command.log, false)) out.push(rec.stream, rec.data);
  return out.result();
}

export function createProcessService(ctx: AgentContext, sessions: SessionManager): ServiceImpl<typeof ProcessService> {
  const launcher = new ShellLauncher(ctx);
  return {
    async execute(req, call) {
      return execute(ctx, launcher, { command: req.command, cwd: req.cwd, envs: req.envs, timeout: req.timeout }, call.signal);
    },

    async codeRun(req, call) {
      return codeRun(ctx, launcher, { code: req.code, language: req.language, argv: req.argv, envs: req.envs, timeout: req.timeout }, call.signal);
    },

    async createSession(req) {
      await sessions.create(req.sessionId);
      return {};
    },

    listSessions() {
      return { sessions: sessions.list().map(sessionView) };
    },

    getSession(req) {
      return sessionView(sessions.get(req.sessionId));
    },

    async deleteSession(req) {
      await sessions.delete(req.sessionId);
      return {};
    },

    async sessionExecute(req, call) {
      if (req.command.trim() === "") throw errors.invalidArgument("command is required");
      const session = sessions.get(req.sessionId);
      const runAsync = req.runAsync || req.async;
      const command = await session.execute(req.command, runAsync, req.suppressInputEcho);
      if (runAsync) return { cmdId: command.id };
      const exitCode = await Promise.race([
        command.done,
        new Promise<never>((_, reject) => {
          const abort = () => reject(errors.unavailable(`call cancelled; command ${command.id} goes on in session ${session.id}`));
          if (call.signal.aborted) abort();
          call.signal.addEventListener("abort", abort, { once: true });
        }),
      ]);
      return { cmdId: command.id, exitCode, ...(await collect(command)) };
    },

    async killAllProcesses() {
      const killed = await killAllProcesses(ctx);
      await sessions.renewShells();
      return { killed };
    },

    getSessionCommand(req) {
      return commandView(sessions.command(req.sessionId, req.commandId).command);
    },

    async getSessionCommandLogs(req) {
      return collect(sessions.command(req.sessionId, req.commandId).command);
    },

    async *streamSessionCommandLogs(req, call) {
      const { command } = sessions.command(req.sessionId, req.commandId);
      for await (const rec of readLog(command.log, req.follow, call.signal)) {
        yield rec.stream === STDOUT ? { data: { case: "stdout", value: rec.data } } : { data: { case: "stderr", value: rec.data } };
      }
    },

    async sendSessionCommandInput(req) {
      const { session, command } = sessions.command(req.sessionId, req.commandId);
      await session.sendInput(command, req.data);
      return {};
    },
  };
}
