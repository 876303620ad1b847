import { setTimeout } from "node:timers/promises";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { CallOptions, Client, Transport } from "@connectrpc/connect";
import { EnvironmentService } from "@sandbar/protocol/gen/sandbar/agent/v1/environment_pb.js";
import { FileService } from "@sandbar/protocol/gen/sandbar/agent/v1/files_pb.js";
import { GitService } from "@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js";
import { InfoService } from "@sandbar/protocol/gen/sandbar/agent/v1/info_pb.js";
import { LspService } from "@sandbar/protocol/gen/sandbar/agent/v1/lsp_pb.js";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { SandboxState, type CreateSandboxRequest, type CreateSandboxRequestSchema, type Sandbox as SandboxInfo, type SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { SandboxChangesService } from "@sandbar/protocol/gen/sandbar/control/v1/changes_pb.js";
import { Changes } from "./changes.ts";
import { sandbarClient } from "./clients.ts";
import { SandbarError, TimeoutError, toSandbarError } from "./errors.ts";
import { FileSystem } from "./toolbox/fs.ts";
import { Processes } from "./toolbox/process.ts";
import { Ptys } from "./toolbox/pty.ts";
import { SANDBOX_HEADER } from "./transport.ts";

/** The request as a plain object. */
export type CreateSandboxParams = Exclude<MessageInitShape<typeof CreateSandboxRequestSchema>, CreateSandboxRequest>;

export interface WaitOptions {
  /** Give up after this long (default 60 s): a TimeoutError. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** States a sandbox does not leave by waiting. */
const DEAD_ENDS = new Set([SandboxState.ERROR, SandboxState.BUILD_FAILED, SandboxState.DESTROYED, SandboxState.DESTROYING]);

/** Polls a sandbox until it reaches `want`; a dead-end state or the deadline is an error. */
export async function waitForState(api: Client<typeof SandboxService>, sandboxId: string, want: SandboxState, o: WaitOptions = {}): Promise<SandboxInfo> {
  const timeout = AbortSignal.timeout(o.timeoutMs ?? 60_000);
  const signal = o.signal ? AbortSignal.any([o.signal, timeout]) : timeout;
  let delay = 100;
  try {
    for (;;) {
      const s = await api.getSandbox({ sandboxId }, { signal });
      if (s.state === want) return s;
      if (DEAD_ENDS.has(s.state) && want !== s.state) {
        throw new SandbarError(`sandbox ${s.id} is ${SandboxState[s.state].toLowerCase()}${s.errorReason ? `: ${s.errorReason}` : ""}`, "failed_precondition", 409);
      }
      await setTimeout(delay, undefined, { signal });
      delay = Math.min(1000, delay * 2);
    }
  } catch (err) {
    if (timeout.aborted && !o.signal?.aborted) throw new TimeoutError(`sandbox ${sandboxId} did not become ${SandboxState[want].toLowerCase()} in ${o.timeoutMs ?? 60_000} ms`, "deadline_exceeded", 408, { cause: err });
    throw toSandbarError(err, signal);
  }
}

/** One sandbox: its last known state (`info`), its lifecycle, and its toolbox over gRPC. */
export class Sandbox {
  /** Files: upload/download streamed, list, stat, mkdir, delete, move (`fs.client` for the rest). */
  readonly fs: FileSystem;
  /** Commands: exec, sessions, log following. */
  readonly process: Processes;
  /** Terminals. */
  readonly pty: Ptys;
  /** git (clone, status, add, commit, branches, checkout, pull, push, history). */
  readonly git: Client<typeof GitService>;
  /** Language servers (start, stop, didOpen, didClose, completions, symbols). */
  readonly lsp: Client<typeof LspService>;
  /** The agent's version and the sandbox's home, work and project folders. */
  readonly agentInfo: Client<typeof InfoService>;
  /** Environment variables of later commands. */
  readonly environment: Client<typeof EnvironmentService>;

  /** What it changed since its creation: entries, a tar or a diff (docs/changesets.md). */
  readonly changes: Changes;

  /** The sandbox as last read from the server. */
  info: SandboxInfo;
  private readonly api: Client<typeof SandboxService>;

  constructor(info: SandboxInfo, api: Client<typeof SandboxService>, transport: Transport) {
    this.info = info;
    this.api = api;
    const h = { [SANDBOX_HEADER]: info.id };
    this.fs = new FileSystem(sandbarClient(FileService, transport, h));
    this.process = new Processes(sandbarClient(ProcessService, transport, h));
    this.pty = new Ptys(sandbarClient(PtyService, transport, h));
    this.git = sandbarClient(GitService, transport, h);
    this.lsp = sandbarClient(LspService, transport, h);
    this.agentInfo = sandbarClient(InfoService, transport, h);
    this.environment = sandbarClient(EnvironmentService, transport, h);
    this.changes = new Changes(sandbarClient(SandboxChangesService, transport), info.id);
  }

  get id(): string {
    return this.info.id;
  }
  get name(): string {
    return this.info.name;
  }
  get state(): SandboxState {
    return this.info.state;
  }

  /** Re-reads the sandbox. */
  async refresh(opts?: CallOptions): Promise<this> {
    this.info = await this.api.getSandbox({ sandboxId: this.id }, opts);
    return this;
  }

  async start(opts?: CallOptions): Promise<this> {
    this.info = await this.api.startSandbox({ sandboxId: this.id }, opts);
    return this;
  }

  async stop(o: { force?: boolean } & CallOptions = {}): Promise<this> {
    const { force, ...opts } = o;
    this.info = await this.api.stopSandbox({ sandboxId: this.id, force }, opts);
    return this;
  }

  /** Freezes the sandbox's processes; `start`, or any call to the sandbox, resumes it. */
  async pause(opts?: CallOptions): Promise<this> {
    this.info = await this.api.pauseSandbox({ sandboxId: this.id }, opts);
    return this;
  }

  async archive(opts?: CallOptions): Promise<this> {
    this.info = await this.api.archiveSandbox({ sandboxId: this.id }, opts);
    return this;
  }

  async delete(o: { force?: boolean } & CallOptions = {}): Promise<void> {
    const { force, ...opts } = o;
    this.info = await this.api.deleteSandbox({ sandboxId: this.id, force }, opts);
  }

  async setLabels(labels: Record<string, string>, opts?: CallOptions): Promise<this> {
    this.info = await this.api.replaceLabels({ sandboxId: this.id, labels }, opts);
    return this;
  }

  /** Waits until the sandbox is started (an error state or the deadline is an error). */
  async waitUntilStarted(o?: WaitOptions): Promise<this> {
    this.info = await waitForState(this.api, this.id, SandboxState.STARTED, o);
    return this;
  }

  async waitUntilStopped(o?: WaitOptions): Promise<this> {
    this.info = await waitForState(this.api, this.id, SandboxState.STOPPED, o);
    return this;
  }
}
