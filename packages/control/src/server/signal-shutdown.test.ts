import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort } from "@sandbar/runner/free-port";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { TEST_SNAPSHOT_CACHE } from "../testing/server.ts";
import { LocalRuntime } from "../sandboxes/local-runtime.ts";
import { eventually } from "../sandboxes/testing/fixtures.ts";

// `sandbar serve` as `npm start` runs it, in its own process group with a full warm pool, stopped
// the ways a terminal and a process manager stop it: the whole group gets SIGTERM or SIGINT (its
// spawner and PostgreSQL too). Nothing of its sandboxes may stay on the host: no mount, no loop
// device, no cgroup. And killed with SIGKILL (nothing cleaned), the next start on its data dir
// removes what was left and says so.

const CLI = fileURLToPath(new URL("../../../cli/src/main.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
const POOL = 2;
const isRoot = process.getuid?.() === 0;

let bundle: string;
const dataDirs: string[] = [];
const servers: Server[] = [];

interface Server {
  child: ChildProcess;
  output: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** What the server's runner uses on the host for its data dir (runner/layout.ts, cgroups). */
function hostNames(dataDir: string) {
  const runnerDir = path.join(dataDir, "runner");
  const key = createHash("sha256").update(runnerDir).digest("hex").slice(0, 12);
  return { runnerDir, runtimeDir: path.join("/run/sandbar", key), cgroupParent: `sandbar-${key}` };
}

async function mountPoints(): Promise<string[]> {
  const text = await readFile("/proc/self/mountinfo", "utf8");
  return text.split("\n").filter(Boolean).map((l) => l.split(" ")[4]!.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))));
}

/** Everything of the data dir's sandboxes on the host: mounts, loop devices, the ids of sandbox cgroups. */
async function onHost(dataDir: string): Promise<{ mounts: string[]; loops: string[]; cgroups: string[] }> {
  const { runtimeDir, cgroupParent } = hostNames(dataDir);
  const mounts = (await mountPoints()).filter((m) => [dataDir, runtimeDir].some((d) => m === d || m.startsWith(d + "/")));
  const loops: string[] = [];
  for (const dev of await readdir("/sys/block")) {
    const backing = await readFile(`/sys/block/${dev}/loop/backing_file`, "utf8").catch(() => "");
    if (backing.startsWith(dataDir + "/")) loops.push(`${dev} ${backing.trim()}`);
  }
  // The server's groups sit below this process's own in each hierarchy (it inherits them); a
  // sandbox has one per v1 hierarchy, named by its id.
  const cgroups = new Set<string>();
  const search = async (dir: string, depth: number): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
      if (!e.isDirectory()) continue;
      const p = path.join(dir, e.name);
      if (e.name !== cgroupParent) {
        if (depth > 0) await search(p, depth - 1);
        continue;
      }
      for (const s of await readdir(p, { withFileTypes: true }).catch(() => [])) if (s.isDirectory()) cgroups.add(s.name);
    }
  };
  for (const root of await ownCgroupDirs()) await search(root, 1);
  return { mounts, loops, cgroups: [...cgroups].sort() };
}

/** This process's cgroup directory in each mounted hierarchy. */
async function ownCgroupDirs(): Promise<string[]> {
  const own = new Map<string, string>();
  for (const line of (await readFile("/proc/self/cgroup", "utf8")).split("\n")) {
    const m = /^\d+:([^:]*):(.*)$/.exec(line);
    if (m) for (const c of m[1] === "" ? [""] : m[1]!.split(",")) own.set(c.replace(/^name=/, ""), m[2]!);
  }
  const dirs: string[] = [];
  for (const line of (await readFile("/proc/self/mountinfo", "utf8")).split("\n")) {
    const [left, right] = line.split(" - ");
    if (!left || !right) continue;
    const [fstype, , options] = right.split(" ");
    const root = left.split(" ")[3]!;
    const point = left.split(" ")[4]!;
    const controllers = fstype === "cgroup2" ? [""] : fstype === "cgroup" ? options!.split(",").map((o) => o.replace(/^name=/, "")) : [];
    const mine = controllers.map((c) => own.get(c)).find((p) => p !== undefined);
    if (mine !== undefined) dirs.push(path.join(point, path.relative(root, mine)));
  }
  return dirs;
}

async function serve(dataDir: string, warmPool: number): Promise<Server> {
  const port = await freePort();
  const env = {
    ...process.env,
    SANDBAR_DATA_DIR: dataDir,
    SANDBAR_PORT: String(port),
    SANDBAR_HOST: "127.0.0.1",
    SANDBAR_BOOTSTRAP_API_KEY: "sbr_" + randomBytes(32).toString("hex"),
    SANDBAR_AGENT_BUNDLE: bundle,
    SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
    SANDBAR_WARM_POOL: String(warmPool),
    SANDBAR_INTERNAL_REGISTRY: "off",
  };
  // Its own process group, as `npm start` in a terminal: a signal to the group reaches its spawner and PostgreSQL too.
  const child = spawn(process.execPath, [CLI, "serve"], { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"], detached: true });
  let out = "";
  child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
  child.stderr!.on("data", (c: Buffer) => (out += c.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const server = { child, output: () => out, exited };
  servers.push(server);
  const ready = eventually("the server to answer", async () => fetch(`http://127.0.0.1:${port}/api/config`).then((r) => r.ok, () => false), 120_000);
  await Promise.race([ready, exited.then(() => Promise.reject(new Error(`the server exited:\n${out}`)))]);
  return server;
}

/** The pool's sandboxes are up: each has its overlay root and its disk image mounted. */
async function poolStarted(dataDir: string, n: number): Promise<void> {
  const { runtimeDir, runnerDir } = hostNames(dataDir);
  await eventually(`${n} warm pool sandboxes to start`, async () => {
    const mounts = await mountPoints();
    const roots = mounts.filter((m) => m.startsWith(runtimeDir + "/") && m.endsWith("/root"));
    const disks = mounts.filter((m) => m.startsWith(path.join(runnerDir, "sandboxes") + "/") && m.endsWith("/disk"));
    return roots.length >= n && disks.length >= n;
  }, 120_000);
}

/** Whether any process of the group is left (the spawner, PostgreSQL). */
function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

async function freshDataDir(): Promise<string> {
  const dir = await mkdtemp("/var/tmp/sandbar-shutdown-");
  dataDirs.push(dir);
  return dir;
}

beforeAll(async () => {
  if (isRoot) bundle = await buildAgentBundle();
}, 120_000);

afterAll(async () => {
  for (const s of servers) if (s.child.pid && groupAlive(s.child.pid)) process.kill(-s.child.pid, "SIGKILL");
  await Promise.all(servers.map((s) => s.exited));
  // Whatever a failed run left under its data dirs: their runners opened here remove it.
  for (const dir of dataDirs) {
    const rt = await LocalRuntime.open({ dataDir: hostNames(dir).runnerDir, snapshotCacheDir: TEST_SNAPSHOT_CACHE, init: { node: process.execPath, bundle } }).catch(() => undefined);
    if (rt) {
      await rt.removeLeftovers((await rt.list()).map((s) => s.id));
      await rt.close();
    }
    await rm(dir, { recursive: true, force: true });
  }
  if (bundle) await rm(bundle, { recursive: true, force: true });
}, 120_000);

describe.skipIf(!isRoot)("stopping `sandbar serve` by signalling its process group", () => {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`${signal} to the whole group: the warm pool's mounts, loop devices and cgroups are gone, and so is the group`, { timeout: 300_000 }, async () => {
      const dataDir = await freshDataDir();
      const server = await serve(dataDir, POOL);
      const pgid = server.child.pid!;
      await poolStarted(dataDir, POOL);
      const before = await onHost(dataDir);
      expect(before.loops).toHaveLength(POOL);
      expect(before.cgroups).toHaveLength(POOL);

      process.kill(-pgid, signal);
      const exit = await server.exited;
      const log = server.output();
      expect(exit, log).toEqual({ code: 0, signal: null });
      expect(log).toContain(`${signal}: shutting down`);
      expect(log).not.toMatch(/shutdown: .* failed|warm pool: removing|reconnecting|did not finish/);
      expect(await onHost(dataDir)).toEqual({ mounts: [], loops: [], cgroups: [] });
      // The spawner left with the server (its channel closed), PostgreSQL was stopped.
      await eventually("the rest of the process group to exit", async () => !groupAlive(pgid), 30_000);
    });
  }

  it("SIGKILL to the whole group leaves the pool behind; the next start on the data dir removes it and says what it removed", { timeout: 300_000 }, async () => {
    const dataDir = await freshDataDir();
    const first = await serve(dataDir, POOL);
    await poolStarted(dataDir, POOL);
    process.kill(-first.child.pid!, "SIGKILL");
    await first.exited;
    const left = await onHost(dataDir);
    expect(left.mounts.length).toBeGreaterThanOrEqual(2 * POOL);
    expect(left.loops).toHaveLength(POOL);
    expect(left.cgroups).toHaveLength(POOL);
    const ids = left.cgroups;

    // No pool this time: what is on the host after the start is what the start left.
    const second = await serve(dataDir, 0);
    // A detached loop device goes once the kernel has released its file system, which it does
    // asynchronously: waited for, with a deadline.
    const clean = JSON.stringify({ mounts: [], loops: [], cgroups: [] });
    await eventually("the start to leave nothing of the killed pool", async () => JSON.stringify(await onHost(dataDir)) === clean, 30_000);
    const log = second.output();
    expect(log).toContain(`leftovers: removed ${POOL} sandbox(es) nothing claims: `);
    for (const id of ids) expect(log).toContain(id);
    expect(log).toMatch(new RegExp(`leftovers: killed [1-9]\\d* processes of sandboxes`));
    // How many of their mounts a loaded host had made when the group was killed varies; none is left (above).
    expect(log).toMatch(/leftovers: removed [1-9]\d* mounts \(overlay roots, disk images, volumes\)/);
    // Their loop devices are not counted: unmounting the disks detaches them (autoclear) unless the
    // kernel still holds the file system, so whether the sweep or the kernel removed them is timing.
    // A pool sandbox still starting when the group died lost its processes with it: the start's
    // own sweep tears it down as idle, the reconcile after it the others. Counted over both.
    const cgroupsRemoved = [...log.matchAll(/leftovers: removed (\d+) sandbox cgroups?\b/g)].reduce((n, m) => n + Number(m[1]), 0);
    expect(cgroupsRemoved, log).toBe(POOL);

    process.kill(-second.child.pid!, "SIGTERM");
    expect(await second.exited, second.output()).toEqual({ code: 0, signal: null });
  });
});
