import { createHash, randomBytes } from "node:crypto";
import { access, chmod, mkdir, mkdtemp, readdir, readFile, rename, writeFile } from "node:fs/promises";
import { stripTypeScriptTypes } from "node:module";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { SandboxProvider, SandboxSpec } from "../../provider.ts";
import { SANDBOX_PATHS } from "../../provider.ts";
import type { LinuxProviderOptions } from "../provider.ts";
import { LinuxProvider } from "../provider.ts";
import { mountsUnder } from "../../host/mounts.ts";
import { sandboxAgent as agentOf, sandboxInit as initOf } from "../sandbox-procs.ts";
import { buildHostUsrRootfs } from "../rootfs.ts";

// Shared by the runner's tests and bench: a provider on a scratch data dir, a small rootfs, and a
// client for exec-agent.ts.

const EXEC_AGENT_SOURCE = fileURLToPath(new URL("./exec-agent.ts", import.meta.url));

/**
 * exec-agent.ts with its types stripped, in a world-searchable directory. Node's on-the-fly type
 * stripping costs ~150 ms per start here; a real agent ships as JavaScript too.
 */
export async function execAgentBundle(): Promise<string> {
  const source = await readFile(EXEC_AGENT_SOURCE, "utf8");
  const dir = path.join(os.tmpdir(), "sandbar-test-agent");
  const file = path.join(dir, `exec-agent-${createHash("sha256").update(source).digest("hex").slice(0, 12)}.mjs`);
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await chmod(dir, 0o755);
  const emit = process.emitWarning;
  process.emitWarning = () => undefined; // "stripTypeScriptTypes is experimental"
  let js: string;
  try {
    js = stripTypeScriptTypes(source);
  } finally {
    process.emitWarning = emit;
  }
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, js, { mode: 0o644 });
  await rename(tmp, file);
  return file;
}

export interface ExecResult {
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

/** Sends one request to an exec-agent socket and returns its reply. */
export function request<T>(socket: string, req: unknown, timeoutMs = 30_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const conn = net.connect(socket);
    let buf = "";
    const timer = setTimeout(() => {
      conn.destroy();
      reject(new Error(`no reply from ${socket} within ${timeoutMs} ms`));
    }, timeoutMs);
    conn.on("connect", () => conn.write(JSON.stringify(req) + "\n"));
    conn.on("data", (c: Buffer) => (buf += c.toString()));
    conn.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    conn.on("end", () => {
      clearTimeout(timer);
      try {
        const v = JSON.parse(buf) as T & { error?: string };
        if (v.error) reject(new Error(v.error));
        else resolve(v);
      } catch {
        reject(new Error(`bad reply from ${socket}: ${buf.slice(0, 200)}`));
      }
    });
  });
}

export async function exec(provider: Pick<SandboxProvider, "connect">, id: string, argv: string[], stdin?: string, timeoutMs?: number): Promise<ExecResult> {
  return request<ExecResult>(await provider.connect(id), { argv, stdin }, timeoutMs);
}

/** `sh -c script` inside the sandbox. */
export function sh(provider: Pick<SandboxProvider, "connect">, id: string, script: string, timeoutMs?: number): Promise<ExecResult> {
  return exec(provider, id, ["/bin/sh", "-c", script], undefined, timeoutMs);
}

export interface Fixture {
  provider: LinuxProvider;
  dataDir: string;
  rootfs: string;
  baseMounts: SandboxSpec["mounts"];
  spec(id: string, over?: Partial<SandboxSpec>): SandboxSpec;
}

/**
 * A provider over a fresh data dir (under /var/tmp: the runtime dir must be traversable anyway,
 * the data dir need not be) with a host-/usr rootfs built in milliseconds.
 */
export async function fixture(options: Partial<LinuxProviderOptions> = {}): Promise<Fixture> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), "sandbar-runner-")));
  const rootfs = path.join(dataDir, "base-rootfs");
  const baseMounts = await buildHostUsrRootfs(rootfs);
  const agent = await execAgentBundle();
  // Each fixture gets its own uid range so parallel test files never share a host uid.
  const uidBase = options.uidBase ?? 1_600_000_000 + randomBytes(2).readUInt16BE() * 1024;
  const provider = await LinuxProvider.open({ ...options, dataDir, uidBase, uidCount: options.uidCount ?? 1024 });
  return {
    provider,
    dataDir,
    rootfs,
    baseMounts,
    spec: (id, over = {}) => ({
      id,
      rootfs,
      mounts: baseMounts,
      cpu: 1,
      memoryGiB: 0.5,
      pidsLimit: 256,
      init: { node: process.execPath, bundle: agent },
      ...over,
    }),
  };
}

export function uniqueId(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** Pids of host processes whose real uid is `uid`. */
export async function processesOfUid(uid: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const status = await readFile(`/proc/${name}/status`, "utf8").catch(() => "");
    const m = /^Uid:\s+(\d+)/m.exec(status);
    if (m && Number(m[1]) === uid) out.push(Number(name));
  }
  return out;
}

async function exists(p: string): Promise<boolean> {
  try {
    await access(p);
    return true;
  } catch {
    return false;
  }
}

/** Everything a destroyed sandbox must not leave behind; empty when clean. */
export async function leftovers(provider: LinuxProvider, id: string, hostUid: number): Promise<string[]> {
  const L = provider.layout;
  const found: string[] = [];
  for (const m of await mountsUnder(L.sandboxDir(id))) found.push(`mount ${m}`);
  for (const m of await mountsUnder(L.runtime(id))) found.push(`mount ${m}`);
  for (const d of provider.cgroups.paths(id)) if (await exists(d)) found.push(`cgroup ${d}`);
  for (const pid of await processesOfUid(hostUid)) {
    const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
    const field = (k: string) => new RegExp(`^${k}:\\s+(.*)$`, "m").exec(status)?.[1] ?? "?";
    found.push(`process ${pid} (${field("Name")}, ${field("State")}, ppid ${field("PPid")})`);
  }
  for (const d of [L.sandboxDir(id), L.runtime(id)]) if (await exists(d)) found.push(`directory ${d}`);
  for (const dev of await readdir("/sys/block").catch(() => [] as string[])) {
    if (!dev.startsWith("loop")) continue;
    const backing = await readFile(`/sys/block/${dev}/loop/backing_file`, "utf8").catch(() => "");
    if (backing.startsWith(L.sandboxDir(id) + "/")) found.push(`loop device ${dev} -> ${backing.trim()}`);
  }
  return found;
}

/** Host pid of the sandbox's init (pid 1 of its namespace). */
export function sandboxInit(provider: LinuxProvider, id: string): Promise<number | undefined> {
  return initOf(provider.cgroups, id);
}

/** Host pid of the sandbox's agent (the init's child running node). */
export function sandboxAgent(provider: LinuxProvider, id: string): Promise<number | undefined> {
  return agentOf(provider.cgroups, id, SANDBOX_PATHS.node);
}

/** Calls `fn` until it succeeds or `ms` pass (then throws its last error). */
export async function retry<T>(fn: () => Promise<T>, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}
