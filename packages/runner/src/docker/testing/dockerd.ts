import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { which } from "../../host/command.ts";

// A Docker engine for tests and benches, started here (never the host's): Debian's dockerd with
// its own data root, exec root, socket and managed containerd under one directory, no bridge, no
// iptables rules (sandboxes run with network "none"; egress is our own veth, see provider.ts) and
// no registry mirror. Starting one costs seconds, so a vitest run shares one: the global setup
// (test/setup/dockerd.ts) names a directory, the first suite that needs the engine starts it there
// under a lock, later ones find it, and the global teardown stops it.

export interface Dockerd {
  /** Directory holding the engine's state, pid file and socket. */
  dir: string;
  socketPath: string;
  /** Whether `runsc` (gVisor) is registered as a runtime of this engine. */
  runsc: boolean;
}

const READY_TIMEOUT_MS = 60_000;

/** Why no engine can run here, or undefined when one can. */
export function dockerdUnavailable(): string | undefined {
  if (process.getuid?.() !== 0) return "dockerd needs root";
  if (!which("dockerd")) return "dockerd is not installed (apt-get install docker.io)";
  return undefined;
}

function paths(dir: string) {
  return {
    socketPath: path.join(dir, "docker.sock"),
    pidFile: path.join(dir, "dockerd.pid"),
    lock: path.join(dir, "lock"),
    ready: path.join(dir, "ready"),
    failed: path.join(dir, "failed"),
    log: path.join(dir, "dockerd.log"),
    config: path.join(dir, "daemon.json"),
  };
}

/**
 * The engine in `dir`, started if nobody has yet. Concurrent callers (test files in parallel
 * forks) agree through an mkdir lock: one starts it, the others wait for its `ready` file.
 */
export async function sharedDockerd(dir: string): Promise<Dockerd> {
  const why = dockerdUnavailable();
  if (why) throw new Error(why);
  await mkdir(dir, { recursive: true, mode: 0o711 });
  const p = paths(dir);
  let mine = false;
  try {
    await mkdir(p.lock);
    mine = true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  if (mine) {
    try {
      return await startDockerd(dir);
    } catch (err) {
      await writeFile(p.failed, (err as Error).message);
      throw err;
    }
  }
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (existsSync(p.failed)) throw new Error(await readFile(p.failed, "utf8"));
    if (existsSync(p.ready)) return JSON.parse(await readFile(p.ready, "utf8")) as Dockerd;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`dockerd in ${dir} was not ready within ${READY_TIMEOUT_MS} ms`);
}

/** Starts an engine in `dir` (a fresh temporary directory when absent) and waits for its API. */
export async function startDockerd(dir?: string): Promise<Dockerd> {
  dir ??= await mkdtemp(path.join("/var/tmp", "sandbar-dockerd-"));
  await mkdir(dir, { recursive: true, mode: 0o711 });
  const p = paths(dir);
  const runsc = which("runsc");
  // gVisor keeps unix sockets inside its own kernel unless told to create them on the host (the
  // agent's socket must be reachable from the runner); its sandboxes have loopback only.
  const config = { runtimes: runsc ? { runsc: { path: runsc, runtimeArgs: ["--host-uds=all", "--network=none"] } } : {}, "registry-mirrors": [] };
  await writeFile(p.config, JSON.stringify(config));
  const args = [
    `--config-file=${p.config}`,
    `--data-root=${path.join(dir, "data")}`,
    `--exec-root=${path.join(dir, "exec")}`,
    `--pidfile=${p.pidFile}`,
    `--host=unix://${p.socketPath}`,
    "--bridge=none",
    "--iptables=false",
    "--ip-forward=false",
    "--ip-masq=false",
    "--storage-driver=overlay2",
    "--log-level=warn",
  ];
  const log = await import("node:fs").then((fs) => fs.openSync(p.log, "a"));
  const child = spawn("dockerd", args, { stdio: ["ignore", log, log], detached: true });
  child.unref();
  let exited: string | undefined;
  child.once("exit", (code, signal) => (exited = `dockerd exited with ${signal ?? code}`));
  const deadline = Date.now() + READY_TIMEOUT_MS;
  while (!(await pings(p.socketPath))) {
    if (exited || Date.now() > deadline) {
      const tail = (await readFile(p.log, "utf8").catch(() => "")).split("\n").slice(-15).join("\n");
      if (!exited) child.kill("SIGKILL");
      throw new Error(`${exited ?? `dockerd did not answer within ${READY_TIMEOUT_MS} ms`}; its log:\n${tail}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const engine: Dockerd = { dir, socketPath: p.socketPath, runsc: runsc !== undefined };
  await writeFile(p.ready, JSON.stringify(engine));
  return engine;
}

/** Whether the engine's API answers `GET /_ping` with OK. */
async function pings(socketPath: string): Promise<boolean> {
  if (!existsSync(socketPath)) return false;
  return new Promise((resolve) => {
    const s = net.connect(socketPath);
    let reply = "";
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(2000, () => done(false));
    s.on("error", () => done(false));
    s.on("data", (c: Buffer) => {
      reply += c.toString();
      if (reply.includes("\r\n\r\n")) done(/^HTTP\/1\.[01] 200/.test(reply));
    });
    s.on("connect", () => s.write("GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"));
  });
}

/** Stops the engine in `dir` if one was started there (SIGTERM, then SIGKILL), and removes `dir`. */
export async function stopDockerd(dir: string): Promise<void> {
  const p = paths(dir);
  const pid = Number((await readFile(p.pidFile, "utf8").catch(() => "")).trim());
  if (Number.isSafeInteger(pid) && pid > 0) {
    const alive = () => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    process.kill(pid, "SIGTERM");
    // dockerd stops its containers (10 s grace each, in parallel) and its containerd.
    for (let i = 0; i < 300 && alive(); i++) await new Promise((r) => setTimeout(r, 100));
    if (alive()) process.kill(pid, "SIGKILL");
  }
  // Shims of containers the engine could not stop (a start the runtime refused) outlive it: they
  // are this engine's own (their command line names its exec root), ended by pid.
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = await readFile(`/proc/${name}/cmdline`, "utf8").catch(() => "");
    if (cmdline.includes(`${dir}/exec/`)) {
      try {
        process.kill(Number(name), "SIGKILL");
      } catch {
        // already gone
      }
    }
  }
  // Mounts left by a killed engine would make rm fail; lazily unmount whatever is under dir.
  const mounts = (await readFile("/proc/self/mountinfo", "utf8")).split("\n").map((l) => l.split(" ")[4]).filter((m): m is string => !!m && m.startsWith(dir + "/"));
  for (const m of mounts.reverse()) await new Promise((r) => spawn("umount", ["-l", m]).once("exit", r));
  await rm(dir, { recursive: true, force: true });
}

/** A scratch directory for an engine of this process alone (benches, a suite run outside vitest's global setup). */
export function privateDockerdDir(): string {
  return path.join(os.tmpdir(), `sandbar-dockerd-${process.pid}`);
}
