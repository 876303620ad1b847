import type { DescFile, DescMethod, DescService } from "@bufbuild/protobuf";
import { create } from "@bufbuild/protobuf";
import { Auth, filesIn, RateLimit, routeOf, type Route } from "@sandbar/protocol";
import { RouteSchema } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";
import type { CallChain } from "../call/chain.ts";
import { AgentClients } from "./agent-clients.ts";
import type { AgentLocator } from "./agent-locator.ts";
import { forwardingImpl } from "./forward.ts";
import { keepingEnv } from "./keeping-env.ts";
import { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";

/**
 * The toolbox's access rule, in one place: any member with `write:sandboxes` (as the reference's
 * toolbox controller requires), with an API key or a JWT, whatever the agent's own options say.
 */
export const TOOLBOX_SCOPE = "write:sandboxes";

/** Where the agent's paths are mounted on the REST API: every client generation's spelling. */
export const TOOLBOX_PREFIXES = [
  "/toolbox/{sandbox_id}/toolbox", // 0.25 / 0.111 clients (and the /workspace era: same shape)
  "/toolbox-proxy/{sandbox_id}", // `proxyToolboxUrl` of /config and each sandbox's toolboxProxyUrl
];

export interface Toolbox {
  files: DescFile[];
  services: DescService[];
  clients: AgentClients;
}

/**
 * The agent's services, forwarded to sandboxes, mounted on the call chain under the toolbox's
 * rule; with `audited` (SANDBAR_AUDIT_TOOLBOX; off by default, as the reference), the calls whose
 * contract declares an audit entry are recorded.
 */
export async function mountToolbox(chain: CallChain, locator: AgentLocator, clients = new AgentClients(), audited = false): Promise<Toolbox> {
  const files = await filesIn("sandbar/agent/v1");
  const services = files.flatMap((f) => f.services);
  const policy = (method: DescMethod): Route =>
    // Not rate limited, as the reference's toolbox (its traffic is work inside a sandbox, not management).
    create(RouteSchema, { status: routeOf(method).status, scope: TOOLBOX_SCOPE, auth: Auth.UNSPECIFIED, audit: audited ? routeOf(method).audit : undefined, rateLimit: RateLimit.NONE });
  for (const service of services) {
    const impl = forwardingImpl(service, locator, clients);
    chain.mount(service, service.typeName === EnvironmentService.typeName ? keepingEnv(impl, locator) : impl, policy);
  }
  return { files, services, clients };
}
