/** What every service needs to know about the agent it runs in. */
export interface AgentContext {
  /** Relative paths resolve against it; commands start in it. */
  readonly workDir: string;
  /** The user's home dir (also the legacy "project dir"). */
  readonly homeDir: string;
  /** Private scratch space of this agent process: session logs, temporary files. */
  readonly stateDir: string;
  /** The environment children get: the agent's own, without its secret. */
  readonly env: NodeJS.ProcessEnv;
  /** Counts changes to `env` (EnvironmentService), so processes started ahead of time can tell they are stale. */
  envGeneration: number;
  /** Dispatches "change" after `env` changed, so what was started ahead of time can be replaced. */
  readonly envChanges: EventTarget;
  /** The user's shell, for sessions, execute and PTYs. */
  readonly shell: string;
  readonly version: string;
  /** Aborted when the agent shuts down. */
  readonly shutdown: AbortSignal;
  /**
   * The agent is a sandbox's: the child of the supervising init that is pid 1 of the sandbox's own
   * pid namespace, so every other process it can signal there is the user's (KillAllProcesses).
   */
  readonly sandboxed: boolean;
  /** Errors worth an operator's attention that no caller receives. */
  readonly log: (message: string, err?: unknown) => void;
}
