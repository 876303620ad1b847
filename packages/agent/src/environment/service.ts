import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import type { AgentContext } from "../context.ts";

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

function checkNames(names: string[]): void {
  const bad = names.filter((k) => !NAME.test(k));
  if (bad.length) throw new ConnectError(`invalid variable names: ${bad.slice(0, 5).join(", ")}`, Code.InvalidArgument);
}

export function createEnvironmentService(ctx: AgentContext): ServiceImpl<typeof EnvironmentService> {
  /** ctx.env is what every spawn reads: later processes, sessions and terminals get the change. */
  const changed = () => {
    ctx.envGeneration++;
    ctx.envChanges.dispatchEvent(new Event("change"));
  };
  return {
    setEnvironment(req) {
      checkNames(Object.keys(req.env));
      Object.assign(ctx.env, req.env);
      changed();
      return {};
    },
    updateEnv(req) {
      checkNames([...Object.keys(req.set), ...req.unset]);
      const prefix = req.unsetValuePrefix;
      const byValue = prefix ? Object.keys(ctx.env).filter((k) => ctx.env[k]?.startsWith(prefix) && !(k in req.set)) : [];
      for (const k of [...req.unset, ...byValue]) delete ctx.env[k];
      Object.assign(ctx.env, req.set);
      changed();
      const env: Record<string, string> = {};
      for (const [k, v] of Object.entries(ctx.env)) if (v !== undefined) env[k] = v;
      return { env };
    },
  };
}
