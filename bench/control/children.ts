/**
 * The two servers under load, each a child process of the same Node: the real control
 * server (`sandbar serve` on a fresh data dir with its embedded PostgreSQL) and the bare
 * floor server. Both are stopped, and their leftovers removed, by `stop()`.
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort } from "@sandbar/runner/free-port";

const ROOT = resolve(fileURLToPath(new URL("../..", import.meta.url)));
const CLI = join(ROOT, "packages/cli/src/main.ts");
const BARE = fileURLToPath(new URL("./bare-server.ts", import.meta.url));
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 15_000;

export interface RunningChild {
  url: string;
  pid: number;
  stop(): Promise<void>;
}

export interface SandbarChild extends RunningChild {
  apiKey: string;
  /** What the child printed, for error messages. */
  output(): string;
}

/** Starts `sandbar serve` (with `env` on top of the bench's) and resolves once GET /api/config answers 200. */
export async function startSandbar(nodeFlags: string[] = [], env: Record<string, string> = {}): Promise<SandbarChild> {
  const dataDir = await mkdtemp(join(tmpdir(), "sandbar-control-bench-"));
  const port = await freePort();
  const apiKey = "sbr_" + randomBytes(32).toString("hex");
  const child = spawn(process.execPath, [...nodeFlags, CLI, "serve"], {
    cwd: ROOT,
    env: {
      ...process.env,
      SANDBAR_PORT: String(port),
      SANDBAR_HOST: "127.0.0.1",
      SANDBAR_DATA_DIR: dataDir,
      SANDBAR_BOOTSTRAP_API_KEY: apiKey,
      DATABASE_URL: "",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const keep = (chunk: Buffer) => {
    output = (output + chunk.toString("utf8")).slice(-20_000);
  };
  child.stdout!.on("data", keep);
  child.stderr!.on("data", keep);
  const url = `http://127.0.0.1:${port}`;
  const handle: SandbarChild = {
    url,
    pid: child.pid!,
    apiKey,
    output: () => output,
    stop: async () => {
      await stopChild(child);
      await stopOrphanPostgres(dataDir);
      await rm(dataDir, { recursive: true, force: true });
    },
  };
  try {
    await waitReady(child, `${url}/api/config`, () => output);
  } catch (err) {
    await handle.stop();
    throw err;
  }
  return handle;
}

/** Starts the bare server answering `path` with `body`. */
export async function startBare(path: string, body: string): Promise<RunningChild> {
  const child = fork(BARE, [], { env: { ...process.env, BARE_PATH: path, BARE_BODY: body }, stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const port = await new Promise<number>((resolve, reject) => {
    child.once("message", (m) => resolve((m as { port: number }).port));
    child.once("exit", (code) => reject(new Error(`bare server exited with code ${code} before listening`)));
    child.once("error", reject);
  });
  return { url: `http://127.0.0.1:${port}`, pid: child.pid!, stop: () => stopChild(child) };
}

async function waitReady(child: ChildProcess, url: string, output: () => string): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let exited = false;
  child.once("exit", () => (exited = true));
  while (Date.now() < deadline) {
    if (exited) throw new Error(`sandbar serve exited before it was ready:\n${output()}`);
    const status = await fetch(url).then((r) => r.status, () => 0);
    if (status === 200) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`sandbar serve did not answer ${url} with 200 within ${READY_TIMEOUT_MS / 1000} s:\n${output()}`);
}

/** SIGTERM (the server stops its PostgreSQL on it), then SIGKILL if it hangs. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
  await exited;
  clearTimeout(timer);
}

/** A server that had to be killed leaves its PostgreSQL running: stop that one too. */
async function stopOrphanPostgres(dataDir: string): Promise<void> {
  const pid = Number((await readFile(join(dataDir, "postgres", "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0]);
  if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return;
  process.kill(pid, "SIGINT");
  for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
  if (alive(pid)) process.kill(pid, "SIGKILL");
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

