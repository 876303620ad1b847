import type { ServiceImpl } from "@connectrpc/connect";
import type { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import type { AgentContext } from "../context.ts";

export function createInfoService(ctx: AgentContext): ServiceImpl<typeof InfoService> {
  return {
    getVersion: () => ({ version: ctx.version }),
    getProjectDir: () => ({ dir: ctx.homeDir }),
    getUserHomeDir: () => ({ dir: ctx.homeDir }),
    getWorkDir: () => ({ dir: ctx.workDir }),
  };
}
