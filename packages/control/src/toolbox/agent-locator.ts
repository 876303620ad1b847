import { errors } from "@sandbar/protocol";

/** Where a sandbox's agent listens, and the secret it expects. */
export interface AgentEndpoint {
  sandboxId: string;
  socket: string;
  secret: string;
}

/**
 * How the toolbox finds a sandbox's agent: by organization and sandbox id or name. Unknown,
 * destroyed and other organizations' sandboxes are NOT_FOUND; sandboxes that are not running
 * fail with the lifecycle's error. Calls through the toolbox count as activity.
 */
export interface AgentLocator {
  agentFor(organizationId: string, idOrName: string): Promise<AgentEndpoint>;
  touch(sandboxId: string): void;
}

/** Until a sandbox runtime is wired in: every toolbox call is refused plainly. */
export const sandboxesUnavailable: AgentLocator = {
  agentFor: async () => {
    throw errors.unavailable("Sandboxes are not available on this server");
  },
  touch: () => {},
};
