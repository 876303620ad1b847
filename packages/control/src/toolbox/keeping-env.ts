import type { MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import type { EnvironmentService, UpdateEnvRequest, UpdateEnvResponseSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import { callKey, organizationOf } from "../call/call.ts";
import type { AgentLocator } from "./agent-locator.ts";

/**
 * The toolbox's EnvironmentService with UpdateEnv (the 0.218 client's `POST /env`) kept beyond the
 * running agent: the locator checks the change, the call is forwarded to the agent, then the
 * sandbox's env changes for its later starts. Without a locator that keeps env, only the agent's.
 */
export function keepingEnv(impl: Partial<ServiceImpl<typeof EnvironmentService>>, locator: AgentLocator): Partial<ServiceImpl<typeof EnvironmentService>> {
  const forward = impl.updateEnv;
  const keep = locator.updateEnv?.bind(locator);
  if (!forward || !keep) return impl;
  return {
    ...impl,
    async updateEnv(req: UpdateEnvRequest, ctx: HandlerContext) {
      const idOrName = ctx.values.get(callKey)?.sandboxId;
      if (!idOrName) throw errors.invalidArgument("the sandbox is missing");
      let answer: MessageInitShape<typeof UpdateEnvResponseSchema> | undefined;
      await keep(organizationOf(ctx), idOrName, { set: req.set, unset: req.unset, unsetValuePrefix: req.unsetValuePrefix }, async () => {
        answer = await forward(req, ctx);
      });
      return answer ?? {};
    },
  };
}
