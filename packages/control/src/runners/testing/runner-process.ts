import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { freePort } from "@sandbar/runner/free-port";
import { TEST_SNAPSHOT_CACHE } from "../../testing/server.ts";
import type { UntypedJson } from "../../casts.ts";

// A real `sandbar runner` process on loopback, with its own data dir and port, for tests.

const CLI = fileURLToPath(new URL("../../../../cli/src/main.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../../../../", import.meta.url));

export interface RunnerProcess {
  url: string;
  port: number;
  credential: string;
  dataDir: string;
  child: ChildProcess;
  output(): string;
  /** Starts the process again on the same data dir and port (after a kill). */
  restart(): Promise<void>;
  /** Ends the process (SIGKILL: what a crash looks like); sandboxes stay. */
  kill(): Promise<void>;
  /** Ends the process and removes its data dir (its sandboxes must be gone already). */
  stop(): Promise<void>;
}

/** `credential`: the one control was given for this runner (default: a random one). */
export async function startRunnerProcess(o: { env?: NodeJS.ProcessEnv; subnet?: string; credential?: string; port?: number; netns?: { name: string; address: string } } = {}): Promise<RunnerProcess> {
  const dataDir = await mkdtemp(path.join(tmpdir(), "sandbar-runner-process-"));
  const port = o.port ?? (await freePort());
  const credential = o.credential ?? randomBytes(24).toString("hex");
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    SANDBAR_DATA_DIR: dataDir,
    SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
    SANDBAR_RUNNER_HOST: o.netns?.address ?? "127.0.0.1",
    SANDBAR_RUNNER_PORT: String(port),
    SANDBAR_RUNNER_CREDENTIAL: credential,
    ...(o.subnet ? { SANDBAR_SANDBOX_SUBNET: o.subnet } : {}),
    ...o.env,
  };
  let out = "";
  let child!: ChildProcess;
  const launch = async () => {
    // In a namespace: nsenter enters its network namespace only and execs node (same pid: a kill
    // reaches the runner). Not `ip netns exec`, which mounts a sysfs of its own over the cgroups.
    const [cmd, args] = o.netns ? ["nsenter", [`--net=/run/netns/${o.netns.name}`, "--", process.execPath, CLI, "runner"]] : [process.execPath, [CLI, "runner"]];
    child = spawn(cmd, args, { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
    const started = new Promise<void>((resolve, reject) => {
      const onData = (c: Buffer) => {
        out += c.toString();
        if (out.includes(" listening on ")) resolve();
      };
      child.stdout!.on("data", onData);
      child.stderr!.on("data", (c: Buffer) => (out += c.toString()));
      child.once("exit", (code) => reject(new Error(`the runner exited (${code}):\n${out}`)));
    });
    const timeout = setTimeout(() => child.kill("SIGKILL"), 60_000);
    await started.finally(() => clearTimeout(timeout));
  };
  // A runner that does not start takes its data dir along.
  await launch().catch(async (err: unknown) => {
    await rm(dataDir, { recursive: true, force: true });
    throw err;
  });
  const kill = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    child.kill("SIGKILL");
    await exited;
  };
  return {
    url: `${o.env?.SANDBAR_RUNNER_TLS_CERT ? "https" : "http"}://${o.netns?.address ?? "127.0.0.1"}:${port}`,
    port,
    credential,
    dataDir,
    get child() {
      return child;
    },
    output: () => out,
    restart: launch,
    kill,
    async stop() {
      await kill();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

type Call = (method: string, p: string, body?: unknown) => Promise<{ status: number; body: UntypedJson }>;

/**
 * A runner registered through `POST /runners` in a region, then started as a process with the
 * credential that answer showed once (on loopback, or at its namespace's address). `id`: the
 * runner's id in the API.
 */
export async function registerRunnerProcess(
  call: Call,
  o: { regionId: string; name: string; subnet?: string; netns?: { name: string; address: string }; env?: NodeJS.ProcessEnv },
): Promise<{ process: RunnerProcess; id: string }> {
  const port = await freePort();
  const made = await call("POST", "/runners", { regionId: o.regionId, name: o.name, apiUrl: `http://${o.netns?.address ?? "127.0.0.1"}:${port}` });
  if (made.status !== 201) throw new Error(`POST /runners answered ${made.status}: ${JSON.stringify(made.body)}`);
  const process = await startRunnerProcess({ port, credential: made.body.apiKey, subnet: o.subnet, netns: o.netns, env: o.env });
  return { process, id: made.body.id as string };
}
