import type { SandboxRecord } from "../db/entities.ts";
import type { AgentEndpoint, AgentLocator, TokenHolder } from "../toolbox/agent-locator.ts";
import { agentFor, previewTokenHolder } from "./agent-endpoints.ts";
import { archive, deleteSandbox } from "./archive-delete.ts";
import { backup } from "./backup.ts";
import { type Checkpoints, changes } from "./changes.ts";
import type { ChangesPart, ChangesQuery } from "@sandbar/runner";
import { create, createFromBuild, type NewSandbox } from "./create.ts";
import type { NetworkFields } from "./network-policy.ts";
import { OperationContext, type Outcome } from "./operation-context.ts";
import { pause } from "./pause-resume.ts";
import { type Resources, resize, setNetwork, update } from "./reconfigure.ts";
import { recover, start, stop } from "./start-stop.ts";
import { fork } from "./fork.ts";
import { ancestorsOf, forksOf, parentOf } from "./lineage.ts";
import { type LayerSnapshots, type SnapshotOfSandbox, snapshotSandbox } from "./snapshot-sandbox.ts";
import type { SandboxPatch } from "./store.ts";
import { markLost } from "./timers.ts";
import { type EnvChange, type TellAgent, updateEnv } from "./update-env.ts";

// The sandbox lifecycle (reference §4.3) as the service, the toolbox and the preview proxy call
// it: each method is one operation of the modules named in its import. What the operations
// share (dependencies, locks, how an API call waits for its operation) is the OperationContext
// it extends, which the timers, recovery and reconcile take as it is.

export { isAuthToken } from "./auth-token.ts";
export type { ImageSource, Placement, PlacementNeed, RunnerDirectory } from "./runner-directory.ts";

export class SandboxManager extends OperationContext implements AgentLocator {
  get(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return this.store.find(organizationId, idOrName);
  }

  /** The toolbox's way in: a started sandbox of the caller's organization. */
  agentFor(organizationId: string, idOrName: string): Promise<AgentEndpoint> {
    return agentFor(this, organizationId, idOrName);
  }

  /** The toolbox's way in for clients that hold no API key: the sandbox's preview token. */
  previewToken(sandboxId: string, token: string): Promise<TokenHolder> {
    return previewTokenHolder(this, sandboxId, token);
  }

  /** Records activity (what the auto-stop timer measures), at most once per throttle period. */
  touch(id: string): void {
    this.activity.touch(id);
  }

  create(input: NewSandbox): Promise<SandboxRecord> {
    return create(this, input);
  }

  createFromBuild(input: NewSandbox, buildInfo: NonNullable<SandboxRecord["buildInfo"]>, build: (id: string, runnerId: string) => Promise<string>): Promise<SandboxRecord> {
    return createFromBuild(this, input, buildInfo, build);
  }

  start(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return start(this, organizationId, idOrName);
  }

  stop(organizationId: string, idOrName: string, force = false): Promise<SandboxRecord> {
    return stop(this, organizationId, idOrName, force);
  }

  /** Freezes a started sandbox (pause-resume.ts); start, or any call to its agent, resumes it. */
  pause(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return pause(this, organizationId, idOrName);
  }

  archive(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return archive(this, organizationId, idOrName);
  }

  delete(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return deleteSandbox(this, organizationId, idOrName);
  }

  backup(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return backup(this, organizationId, idOrName);
  }

  /** What the sandbox changed since its creation or a checkpoint (`since`: a snapshot of it), streamed from its runner (changes.ts). */
  changes(organizationId: string, idOrName: string, query: Omit<ChangesQuery, "since">, since?: { name: string; checkpoints?: Checkpoints }): AsyncGenerator<ChangesPart> {
    return changes(this, organizationId, idOrName, query, since);
  }

  resize(organizationId: string, idOrName: string, want: Partial<Resources>): Promise<SandboxRecord> {
    return resize(this, organizationId, idOrName, want);
  }

  setNetwork(organizationId: string, idOrName: string, next: (current: NetworkFields) => NetworkFields): Promise<SandboxRecord> {
    return setNetwork(this, organizationId, idOrName, next);
  }

  update(organizationId: string, idOrName: string, patch: SandboxPatch): Promise<SandboxRecord> {
    return update(this, organizationId, idOrName, patch);
  }

  /** Leaves a recoverable `error`: started again, or stopped with skipStart. */
  recover(organizationId: string, idOrName: string, skipStart = false): Promise<SandboxRecord> {
    return recover(this, organizationId, idOrName, skipStart);
  }

  /** The running agent's environment and the sandbox's env for later starts. */
  updateEnv(organizationId: string, idOrName: string, change: EnvChange, tell: TellAgent): Promise<SandboxRecord> {
    return updateEnv(this, organizationId, idOrName, change, tell);
  }

  /** A snapshot of the sandbox's filesystem now (snapshot-sandbox.ts). */
  createSnapshot(snapshots: LayerSnapshots, organizationId: string, idOrName: string, req: SnapshotOfSandbox): Promise<SandboxRecord> {
    return snapshotSandbox(this, snapshots, organizationId, idOrName, req);
  }

  /** One fork per name (undefined: a generated name), sharing one capture (fork.ts). */
  fork(organizationId: string, idOrName: string, names: Array<string | undefined>): Promise<SandboxRecord[]> {
    return fork(this, organizationId, idOrName, names);
  }

  forks(organizationId: string, idOrName: string, includeDestroyed?: boolean): Promise<SandboxRecord[]> {
    return forksOf(this, organizationId, idOrName, includeDestroyed);
  }

  parent(organizationId: string, idOrName: string): Promise<SandboxRecord> {
    return parentOf(this, organizationId, idOrName);
  }

  ancestors(organizationId: string, idOrName: string): Promise<SandboxRecord[]> {
    return ancestorsOf(this, organizationId, idOrName);
  }

  /** What the timers do for a started sandbox whose first process is gone: it is marked `error`. */
  markLost(id: string, reason: string): Promise<Outcome> | undefined {
    return markLost(this, id, reason);
  }
}
