import type { AgentDial } from "../sandboxes/runtime.ts";

/** A sandbox's agent: how to reach it and the secret it expects. */
export interface AgentEndpoint extends AgentDial {
  sandboxId: string;
}

/** The sandbox a preview token opens, and the organization it belongs to. */
export interface TokenHolder {
  sandboxId: string;
  organizationId: string;
}

/**
 * How the toolbox finds a sandbox's agent: by organization and sandbox id or name. Unknown,
 * destroyed and other organizations' sandboxes are NOT_FOUND; sandboxes that are not running
 * fail with the lifecycle's error. Calls through the toolbox count as activity.
 */
export interface AgentLocator {
  agentFor(organizationId: string, idOrName: string): Promise<AgentEndpoint>;
  touch(sandboxId: string): void;
  /**
   * Optional: checks a sandbox's preview token (WebSocket clients that send no API key or JWT,
   * only `X-Daytona-Preview-Token` or `?DAYTONA_SANDBOX_AUTH_KEY=`) and names the sandbox's
   * organization; throws UNAUTHENTICATED for a wrong token, NOT_FOUND for an unknown sandbox.
   */
  previewToken?(sandboxId: string, token: string): Promise<TokenHolder>;
  /**
   * Optional: the toolbox's `POST /env` (EnvironmentService.UpdateEnv) beyond the agent: checks the
   * change, lets `tell` forward it to the running agent, then keeps it for the sandbox's later starts.
   */
  updateEnv?(organizationId: string, idOrName: string, change: { set: Record<string, string>; unset: string[]; unsetValuePrefix?: string }, tell: () => Promise<void>): Promise<unknown>;
}
