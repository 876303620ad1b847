/**
 * Test support for the toolbox REST suites: a real agent (in this process, or as its own
 * process when a test measures the control process's memory) on a unix socket, and a real
 * control server whose locator names that agent as sandbox "sbx-1". The locator is the one
 * stand-in: real sandboxes come from the lifecycle.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startAgent } from "@sandbar/agent";
import { errors } from "@sandbar/protocol";
import type { AgentEndpoint, AgentLocator } from "../agent-locator.ts";
import { unixAgentDial } from "../../sandboxes/runtime.ts";
import { startTestServer, type TestServer } from "../../testing/server.ts";

export const SANDBOX = "sbx-1";
export const PREVIEW_TOKEN = "preview-token-1";
export const PREFIXES = [`/toolbox/${SANDBOX}/toolbox`, `/toolbox-proxy/${SANDBOX}`];

export interface Fixture {
  server: TestServer;
  /** The control server's base URL (no /api). */
  url: string;
  adminKey: string;
  /** The agent's root: its work dir and home. */
  root: string;
  /** `{url}/api{prefix}` for the 0.25/0.111 toolbox prefix. */
  toolbox: string;
  /** Where the agent runs, for memory measurements. */
  agentPid: number;
  touched: string[];
  stop(): Promise<void>;
}

export async function startFixture(opts: { agentProcess?: boolean } = {}): Promise<Fixture> {
  const dir = await mkdtemp(join(tmpdir(), "sandbar-rest-"));
  const root = join(dir, "home");
  await mkdir(root);
  const socket = join(dir, "agent.sock");
  const secret = randomBytes(16).toString("hex");
  let stopAgent: () => Promise<void>;
  let agentPid = process.pid;
  if (opts.agentProcess) {
    const child = await spawnAgent(dir, socket, secret, root);
    agentPid = child.pid!;
    stopAgent = () =>
      new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve(); // ended already (a test may kill it)
        child.once("exit", () => resolve());
        child.kill("SIGTERM");
      });
  } else {
    const agent = await startAgent({ socketPath: socket, secret, root, stateDir: join(dir, "state"), env: { ...process.env, HOME: root }, log: () => {} });
    stopAgent = () => agent.close();
  }
  const endpoint: AgentEndpoint = { sandboxId: SANDBOX, ...unixAgentDial(socket, secret) };
  const touched: string[] = [];
  const locator: AgentLocator = {
    agentFor: async (_org, idOrName) => {
      if (idOrName !== SANDBOX) throw errors.notFound(`Sandbox with ID or name ${idOrName} not found`);
      return endpoint;
    },
    touch: (id) => touched.push(id),
    previewToken: async (sandboxId, token) => {
      if (sandboxId !== SANDBOX) throw errors.notFound(`Sandbox with ID or name ${sandboxId} not found`);
      if (token !== PREVIEW_TOKEN) throw errors.unauthenticated();
      return { sandboxId, organizationId: "the-fixture's-organization" };
    },
  };
  const server = await startTestServer({ control: { agentLocator: locator } });
  return {
    server,
    url: server.url,
    adminKey: server.adminKey,
    root,
    toolbox: `${server.url}/api/toolbox/${SANDBOX}/toolbox`,
    agentPid,
    touched,
    async stop() {
      await server.stop();
      await stopAgent();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** The agent as its own process, through its command-line entry point. */
async function spawnAgent(dir: string, socket: string, secret: string, root: string): Promise<ChildProcess> {
  const main = join(dirname(fileURLToPath(import.meta.resolve("@sandbar/agent"))), "main.ts");
  const secretFile = join(dir, "secret");
  await writeFile(secretFile, secret, { mode: 0o600 });
  const child = spawn(process.execPath, [main, "--socket", socket, "--secret-file", secretFile, "--root", root, "--state-dir", join(dir, "state")], {
    env: { ...process.env, HOME: root },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      if (out.includes('"event":"ready"')) resolve();
    });
    child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
    child.once("exit", (code) => reject(new Error(`the agent exited with ${code} before it was ready:\n${out}`)));
  });
  return child;
}

/** fetch with the admin key (or the given headers) against a toolbox path. */
export function toolboxFetch(f: Fixture, path: string, init: RequestInit & { prefix?: string } = {}): Promise<Response> {
  const base = init.prefix ? `${f.url}/api${init.prefix}` : f.toolbox;
  const headers = new Headers(init.headers);
  if (!headers.has("authorization")) headers.set("authorization", `Bearer ${f.adminKey}`);
  return fetch(`${base}${path}`, { ...init, headers });
}
