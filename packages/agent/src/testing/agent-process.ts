/**
 * Test support: the agent as a real child process on a temporary directory,
 * and clients that reach it over its unix socket.
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import type { Client, Transport } from "@connectrpc/connect";
import { agentTransport } from "../client.ts";
import type { DescService } from "@bufbuild/protobuf";

export const MAIN = fileURLToPath(new URL("../main.ts", import.meta.url));

export interface AgentProcess {
  child: ChildProcess;
  /** The temporary dir: root of the agent (its work and home dir). */
  dir: string;
  /** The agent's root inside dir. */
  root: string;
  /** The agent's state dir (session logs, scratch) inside dir. */
  stateDir: string;
  socketPath: string;
  secret: string;
  transport: Transport;
  client<S extends DescService>(service: S): Client<S>;
  /** Everything the agent printed on stdout and stderr so far. */
  output(): string;
  /** SIGTERM (SIGKILL after 10 s), wait for exit, remove the temporary dir. */
  stop(): Promise<number | null>;
}

export interface StartOptions {
  /** Extra environment for the agent. */
  env?: NodeJS.ProcessEnv;
  /** Command to run instead of `node main.ts` (e.g. the bundle). */
  command?: string[];
  extraArgs?: string[];
}

/** A Connect transport over the agent's unix socket (HTTP/2, gRPC protocol). */
export function socketTransport(socketPath: string, secret: string): Transport {
  return agentTransport(socketPath, secret);
}

export async function startAgentProcess(opts: StartOptions = {}): Promise<AgentProcess> {
  const dir = await mkdtemp(path.join(tmpdir(), "agent-test-"));
  const root = path.join(dir, "home");
  await import("node:fs/promises").then((fs) => fs.mkdir(root));
  const socketPath = path.join(dir, "agent.sock");
  const stateDir = path.join(dir, "state");
  const secret = `secret-${Math.random().toString(36).slice(2)}`;
  const secretFile = path.join(dir, "secret");
  await writeFile(secretFile, secret, { mode: 0o600 });
  const cmd = opts.command ?? [process.execPath, MAIN];
  const child = spawn(cmd[0], [...cmd.slice(1), "--socket", socketPath, "--secret-file", secretFile, "--root", root, "--state-dir", stateDir, ...(opts.extraArgs ?? [])], {
    env: { ...process.env, HOME: root, GIT_CONFIG_NOSYSTEM: "1", ...opts.env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.setEncoding("utf8");
  child.stderr!.setEncoding("utf8");
  child.stderr!.on("data", (d: string) => (out += d));
  await new Promise<void>((resolve, reject) => {
    const onData = (d: string) => {
      out += d;
      if (out.includes('"event":"ready"')) resolve();
    };
    child.stdout!.on("data", onData);
    child.once("exit", (code) => reject(new Error(`agent exited with ${code} before ready:\n${out}`)));
  });
  const transport = socketTransport(socketPath, secret);
  return {
    child,
    dir,
    root,
    stateDir,
    socketPath,
    secret,
    transport,
    client: (service) => createClient(service, transport),
    output: () => out,
    async stop() {
      const exited = new Promise<number | null>((resolve) => {
        if (child.exitCode !== null) resolve(child.exitCode);
        else child.once("exit", (code) => resolve(code));
      });
      child.kill("SIGTERM");
      // An agent that does not stop is a defect the caller's assertions report; never leave it behind.
      const killer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      const code = await exited;
      clearTimeout(killer);
      await rm(dir, { recursive: true, force: true });
      return code;
    },
  };
}
