import path from "node:path";
import Docker from "dockerode";
import type { SandboxSpec } from "../provider.ts";
import { SANDBOX_PATHS } from "../provider.ts";
import { diskBytesOf, memoryBytesOf } from "../spec.ts";
import { accepts } from "../host/agent-socket.ts";
import { INIT_SCRIPT, initArgs } from "../host/init-script.ts";
import type { Layout } from "../host/layout.ts";
import type { SandboxUser } from "./user-prep.ts";

// The engine's side of the Docker provider: one container per sandbox, named
// `sandbar-<runner key>-<id>` and labelled with both, made from the sandbox's spec; its state,
// its output, and the engine calls that start, stop and remove it.

const ENV_FILE = "/run/sandbar/env";
const LABEL_RUNNER = "sandbar.runner";
const LABEL_ID = "sandbar.sandbox";

export interface ContainerState {
  running: boolean;
  /** Frozen by `docker pause` (the engine keeps `running` true meanwhile). */
  paused: boolean;
  pid: number;
  startedAt?: string;
  exitCode?: number;
  oomKilled?: boolean;
  upperDir?: string;
  workDir?: string;
  /** The image's layers below the upper, top first (overlay2's LowerDir). */
  lowerDirs?: string[];
}

/** What a container's mounts point at on the host. */
export interface ContainerHostPaths {
  layout: Layout;
  /** The host's sh, bound as the sandbox's init. */
  initSh: string;
  volumeGid: number;
}

/** CPU as the engine counts it (a tenth of a core at least). */
const nanoCpus = (cpu: number) => Math.max(10_000_000, Math.round(cpu * 1e9));

export class Containers {
  readonly docker: Docker;
  /** OCI runtime of the containers: "runc" or "runsc" (gVisor). */
  readonly runtime: string;
  readonly #key: string;
  readonly #log: (line: string) => void;
  /** Whether the engine can cap a container's writable layer; unknown until the first capped create. */
  #diskCaps: boolean | undefined;

  constructor(docker: Docker, runtime: string, key: string, log: (line: string) => void) {
    this.docker = docker;
    this.runtime = runtime;
    this.#key = key;
    this.#log = log;
  }

  name(id: string): string {
    return `sandbar-${this.#key}-${id}`;
  }

  #container(id: string): Docker.Container {
    return this.docker.getContainer(this.name(id));
  }

  /** Makes the sandbox's container (not started); a disk cap only where the engine's storage allows one. */
  async create(spec: SandboxSpec, image: string, user: SandboxUser, host: ContainerHostPaths, bundleIsDir: boolean): Promise<void> {
    const options = this.#options(spec, image, user, host, bundleIsDir);
    try {
      await this.docker.createContainer(options);
      if (options.HostConfig!.StorageOpt) this.#diskCaps = true;
    } catch (err) {
      // Most engines cannot cap a container's writable layer (overlay2 needs xfs with pquota): said once, then not asked again.
      if (!options.HostConfig!.StorageOpt || !/storage-opt|StorageOpt|quota/i.test((err as Error).message)) throw err;
      this.#diskCaps = false;
      this.#log(`docker: the engine cannot cap a container's disk (${(err as Error).message.trim()}): disk caps are not enforced`);
      delete options.HostConfig!.StorageOpt;
      await this.docker.createContainer(options);
    }
  }

  #options(spec: SandboxSpec, image: string, user: SandboxUser, host: ContainerHostPaths, bundleIsDir: boolean): Docker.ContainerCreateOptions {
    const id = spec.id;
    const L = host.layout;
    const agentEntry = bundleIsDir ? path.join(SANDBOX_PATHS.agent, spec.init.main!) : path.join(SANDBOX_PATHS.agent, path.basename(spec.init.bundle));
    const binds = [
      `${host.initSh}:${SANDBOX_PATHS.init}:ro`,
      `${spec.init.node}:${SANDBOX_PATHS.node}:ro`,
      bundleIsDir ? `${spec.init.bundle}:${SANDBOX_PATHS.agent}:ro` : `${spec.init.bundle}:${agentEntry}:ro`,
      `${L.runDir(id)}:${SANDBOX_PATHS.runDir}:rw`,
      `${path.join(L.runtime(id), "resolv.conf")}:/etc/resolv.conf:ro`,
      ...(spec.mounts ?? []).map((m) => `${m.source}:${m.target}:${m.readonly === false ? "rw" : "ro"}`),
      ...(spec.volumes ?? []).map((v, i) => `${path.join(L.runtime(id), "volumes", String(i))}:${v.target}:rw`),
    ];
    const hasVolumes = (spec.volumes?.length ?? 0) > 0;
    // The env file is sourced before the init so setEnv applies at the next start without a new container.
    const init = `set -a; . ${ENV_FILE}; set +a; ${hasVolumes ? "umask 002; " : ""}${INIT_SCRIPT}`;
    const cmd = [SANDBOX_PATHS.init, "-c", init, ...initArgs(SANDBOX_PATHS.agentRestarts), SANDBOX_PATHS.node, ...(spec.init.nodeArgs ?? []), agentEntry, "--socket", SANDBOX_PATHS.agentSocket, "--state-dir", SANDBOX_PATHS.agentState];
    if (spec.init.secret !== undefined) cmd.push("--secret-file", SANDBOX_PATHS.secretFile);
    cmd.push(...(spec.init.args ?? []));
    const memory = memoryBytesOf(spec);
    const disk = diskBytesOf(spec);
    return {
      name: this.name(id),
      Image: image,
      Entrypoint: [cmd[0]!],
      Cmd: cmd.slice(1),
      User: `${user.uid}:${user.gid}`,
      WorkingDir: spec.workdir ?? user.home,
      Hostname: id,
      Env: [],
      Labels: { [LABEL_RUNNER]: this.#key, [LABEL_ID]: id },
      NetworkDisabled: false,
      HostConfig: {
        Binds: binds,
        NetworkMode: "none",
        CapDrop: ["ALL"],
        SecurityOpt: ["no-new-privileges"],
        IpcMode: "private",
        NanoCpus: nanoCpus(spec.cpu),
        Memory: memory,
        MemorySwap: memory, // no swap on top
        PidsLimit: spec.pidsLimit,
        // /dev/shm is memory charged to the sandbox: half of it at most, as the linux provider.
        ShmSize: Math.floor(memory / 2),
        GroupAdd: hasVolumes ? [String(host.volumeGid)] : [],
        Runtime: this.runtime,
        RestartPolicy: { Name: "no" },
        LogConfig: { Type: "json-file", Config: { "max-size": "1m", "max-file": "1" } },
        ...(disk !== undefined && this.#diskCaps !== false ? { StorageOpt: { size: String(disk) } } : {}),
      },
    };
  }

  async start(id: string): Promise<void> {
    await this.#container(id).start();
  }

  /** New cpu and memory, live when the container runs. */
  async update(id: string, cpu: number, memoryBytes: number): Promise<void> {
    await this.#container(id).update({ NanoCpus: nanoCpus(cpu), Memory: memoryBytes, MemorySwap: memoryBytes });
  }

  /** Freezes every process of the container (the engine's cgroup freezer); callers look first whether it is paused. */
  async pause(id: string): Promise<void> {
    await this.#container(id).pause();
  }

  /** Thaws a paused container (the engine answers 500 for one that is not: callers look first). */
  async unpause(id: string): Promise<void> {
    await this.#container(id).unpause();
  }

  /** SIGTERM, then SIGKILL after the grace time; a stopped or missing container is fine. */
  async stop(id: string, graceMs: number): Promise<void> {
    await this.#container(id)
      .stop({ t: Math.ceil(graceMs / 1000) })
      .catch((err: { statusCode?: number }) => {
        if (err.statusCode !== 304 && err.statusCode !== 404) throw err;
      });
  }

  async kill(id: string): Promise<void> {
    await this.#container(id)
      .kill({ signal: "SIGKILL" })
      .catch((err: { statusCode?: number }) => {
        if (err.statusCode !== 409 && err.statusCode !== 404) throw err; // 409: not running
      });
    await this.#container(id).wait({ condition: "not-running" }).catch(() => undefined);
  }

  async remove(id: string): Promise<void> {
    await this.#container(id)
      .remove({ force: true, v: true })
      .catch((err: { statusCode?: number }) => {
        if (err.statusCode !== 404) throw err;
      });
  }

  /** The container's state; undefined when the engine has no such container. */
  async state(id: string): Promise<ContainerState | undefined> {
    try {
      const c = await this.#container(id).inspect();
      const data = (c.GraphDriver?.Data ?? {}) as Record<string, string>;
      return {
        running: c.State.Running,
        paused: c.State.Paused,
        pid: c.State.Pid,
        startedAt: c.State.StartedAt,
        exitCode: c.State.ExitCode,
        oomKilled: c.State.OOMKilled,
        upperDir: data.UpperDir,
        workDir: data.WorkDir,
        lowerDirs: data.LowerDir ? data.LowerDir.split(":") : [],
      };
    } catch (err) {
      if ((err as { statusCode?: number }).statusCode === 404) return undefined;
      throw err;
    }
  }

  /** The end of the container's output, for error messages. */
  async logTail(id: string): Promise<string> {
    try {
      const buf = await this.#container(id).logs({ stdout: true, stderr: true, tail: 20, follow: false });
      const text = demux(buf).trim();
      return text ? `; its output:\n${text}` : "";
    } catch {
      return "";
    }
  }

  /** Whether a process of the container runs the agent's node (the engine lists them from the host). */
  async agentRunning(id: string, socket: string): Promise<boolean> {
    // gVisor's processes live in its own kernel: the engine lists only the sandbox's host processes.
    if (this.runtime === "runsc") return (await accepts(socket)) === "accepting";
    try {
      const top = (await this.#container(id).top({ ps_args: "-o pid,args" })) as { Processes?: string[][] };
      return (top.Processes ?? []).some((p) => (p[1] ?? "").startsWith(SANDBOX_PATHS.node + " "));
    } catch {
      return false;
    }
  }
}

/** The engine's multiplexed log stream (8-byte frame headers) as text. */
function demux(buf: Buffer): string {
  let out = "";
  let i = 0;
  while (i + 8 <= buf.length) {
    const len = buf.readUInt32BE(i + 4);
    out += buf.subarray(i + 8, i + 8 + len).toString();
    i += 8 + len;
  }
  return out;
}
