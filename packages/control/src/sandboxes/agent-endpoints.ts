import { Code, ConnectError, errors } from "@sandbar/protocol";
import type { SandboxRecord } from "../db/entities.ts";
import type { AgentEndpoint, TokenHolder } from "../toolbox/agent-locator.ts";
import { isAuthToken } from "./auth-token.ts";
import { bad, type OperationContext, stateChangeInProgress } from "./operation-context.ts";
import { resumedForCall } from "./pause-resume.ts";
import { isErrored } from "./states.ts";

// The toolbox's way to a sandbox's agent (toolbox/agent-locator.ts): by organization and id or
// name, or by preview token; found endpoints are kept in the context's EndpointCache.

/** A started sandbox of the caller's organization (a paused one is resumed first). */
export async function agentFor(c: OperationContext, organizationId: string, idOrName: string): Promise<AgentEndpoint> {
  const hit = c.endpoints.get(organizationId, idOrName);
  if (hit) {
    if (c.locks.busy(hit.sandboxId)) throw stateChangeInProgress();
    return hit;
  }
  let since = c.endpoints.generation();
  const found = await c.store.find(organizationId, idOrName);
  // Auto-resume: a paused (or resuming) sandbox's call waits for the one resume of its callers.
  const row = await resumedForCall(c, found);
  if (row !== found) since = c.endpoints.generation();
  const endpoint = await endpointOf(c, row);
  if ((await c.runtimeOf(row)).agentsOnThisHost) c.endpoints.set(organizationId, idOrName, endpoint, since);
  return endpoint;
}

/**
 * The way in for clients that hold no API key: the sandbox's preview token. The toolbox is the
 * reference's port 2280, which needs the token even on a public sandbox. A wrong token is
 * UNAUTHENTICATED; an unknown sandbox NOT_FOUND.
 */
export async function previewTokenHolder(c: OperationContext, sandboxId: string, token: string): Promise<TokenHolder> {
  const row = await c.store.byId(sandboxId);
  if (!row || row.state === "destroyed" || (isErrored(row.state) && row.desiredState === "destroyed")) {
    throw errors.notFound(`Sandbox with ID or name ${sandboxId} not found`);
  }
  if (!isAuthToken(row.authToken, token)) throw errors.unauthenticated();
  return { sandboxId: row.id, organizationId: row.organizationId };
}

/**
 * A sandbox just started, answered to its creator: its first toolbox call finds the agent
 * without a lookup (dialled while the answer goes out; a write to any sandbox meanwhile and the
 * call looks it up as before), and writes no activity stamp (its row has one from this moment).
 */
export function readyForCalls(c: OperationContext, row: SandboxRecord): void {
  c.activity.stamped(row.id);
  const since = c.endpoints.generation();
  void (async () => {
    const rt = await c.runtimeOf(row);
    if (!rt.agentsOnThisHost || c.locks.busy(row.id)) return;
    const dial = await rt.connectAgent(row.id);
    c.endpoints.set(row.organizationId, row.id, { sandboxId: row.id, key: dial.key, secret: dial.secret, api: dial.api, tunnel: dial.tunnel }, since);
  })().catch(() => undefined);
}

async function endpointOf(c: OperationContext, row: SandboxRecord): Promise<AgentEndpoint> {
  if (isErrored(row.state)) throw bad("Sandbox is not running");
  if (c.locks.busy(row.id) || row.state !== row.desiredState) throw stateChangeInProgress();
  if (row.state !== "started") throw bad("Sandbox is not running");
  const rt = await c.runtimeOf(row);
  try {
    const dial = await rt.connectAgent(row.id);
    return { sandboxId: row.id, key: dial.key, secret: dial.secret, api: dial.api, tunnel: dial.tunnel };
  } catch (err) {
    if (err instanceof ConnectError && err.code === Code.FailedPrecondition) throw bad("Sandbox is not running");
    throw err;
  }
}
