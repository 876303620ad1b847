import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import type { AgentContext } from "../context.ts";

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function createEnvironmentService(ctx: AgentContext): ServiceImpl<typeof EnvironmentService> {
  return {
    setEnvironment(req) {
      const bad = [...Object.keys(req.env), ...req.unset].filter((k) => !NAME.test(k));
      if (bad.length) throw new ConnectError(`invalid variable names: ${bad.slice(0, 5).join(", ")}`, Code.InvalidArgument);
      // ctx.env is what every spawn reads: later processes, sessions and terminals get these.
      for (const k of req.unset) delete ctx.env[k];
      Object.assign(ctx.env, req.env);
      ctx.envGeneration++;
      ctx.envChanges.dispatchEvent(new Event("change"));
      return {};
    },
  };
}
