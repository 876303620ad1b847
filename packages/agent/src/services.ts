import type { ConnectRouter } from "@connectrpc/connect";
import type { AgentContext } from "./context.ts";
import type { LspManager } from "./lsp/manager.ts";
import type { PtyManager } from "./pty/manager.ts";
import type { SessionManager } from "./sessions/manager.ts";

/** Areas that hold processes, known once loaded so shutdown can end them. */
export interface Areas {
  sessions?: SessionManager;
  ptys?: PtyManager;
  lsps?: LspManager;
}

/** Registers one service (its descriptor and implementation) on a router. */
export type ServiceLoader = (ctx: AgentContext, areas: Areas) => Promise<(router: ConnectRouter) => void>;

/**
 * Every service, by its fully-qualified name, loaded on its first call: the
 * descriptor and the implementation (and the heavy modules behind it: git,
 * node-pty, language servers) cost nothing until a caller needs them.
 */
export const serviceLoaders: Record<string, ServiceLoader> = {
  "sandbar.agent.v1.InfoService": async (ctx) => {
    const [{ InfoService }, { createInfoService }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js"),
      import("./info/service.ts"),
    ]);
    return (r) => r.service(InfoService, createInfoService(ctx));
  },
  "sandbar.agent.v1.EnvironmentService": async (ctx) => {
    const [{ EnvironmentService }, { createEnvironmentService }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js"),
      import("./environment/service.ts"),
    ]);
    return (r) => r.service(EnvironmentService, createEnvironmentService(ctx));
  },
  "sandbar.agent.v1.FileService": async (ctx) => {
    const [{ FileService }, { createFileService }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js"),
      import("./files/service.ts"),
    ]);
    return (r) => r.service(FileService, createFileService(ctx));
  },
  "sandbar.agent.v1.ProcessService": async (ctx, areas) => {
    const [{ ProcessService }, { createProcessService }, { SessionManager }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js"),
      import("./process/service.ts"),
      import("./sessions/manager.ts"),
    ]);
    areas.sessions ??= new SessionManager(ctx);
    const sessions = areas.sessions;
    return (r) => r.service(ProcessService, createProcessService(ctx, sessions));
  },
  "sandbar.agent.v1.GitService": async (ctx) => {
    const [{ GitService }, { createGitService }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js"),
      import("./git/service.ts"),
    ]);
    return (r) => r.service(GitService, createGitService(ctx));
  },
  "sandbar.agent.v1.PtyService": async (ctx, areas) => {
    const [{ PtyService }, { createPtyService }, { PtyManager }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js"),
      import("./pty/service.ts"),
      import("./pty/manager.ts"),
    ]);
    areas.ptys ??= new PtyManager(ctx);
    const ptys = areas.ptys;
    return (r) => r.service(PtyService, createPtyService(ptys));
  },
  "sandbar.agent.v1.LspService": async (ctx, areas) => {
    const [{ LspService }, { createLspService }, { LspManager }] = await Promise.all([
      import("@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js"),
      import("./lsp/service.ts"),
      import("./lsp/manager.ts"),
    ]);
    areas.lsps ??= new LspManager(ctx);
    const lsps = areas.lsps;
    return (r) => r.service(LspService, createLspService(ctx, lsps));
  },
};
