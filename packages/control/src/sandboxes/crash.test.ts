import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { access, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect, it } from "vitest";
import { freePort } from "@sandbar/runner/free-port";
import { api, TEST_SNAPSHOT_CACHE } from "../testing/server.ts";
import { LocalRuntime } from "./local-runtime.ts";
import { sh } from "./testing/agent-client.ts";
import { eventually } from "./testing/fixtures.ts";
import { processesOfUids, runnerLeftovers } from "./testing/leaks.ts";
import { standInAgentBundle } from "./testing/stand-in-agent.ts";

// kill -9 of a real server process (`sandbar serve`) with sandboxes running and operations in
// flight; a new server on the same data dir must bring every sandbox back (or report it
// cleanly) and leave nothing behind that the database does not know.

const CLI = fileURLToPath(new URL("../../../cli/src/main.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../../../", import.meta.url));

let dataDir: string;
let env: NodeJS.ProcessEnv;
let url: string;
const key = "sbr_" + randomBytes(32).toString("hex");
const servers: ChildProcess[] = [];

async function serve(): Promise<{ child: ChildProcess; output: () => string }> {
  const child = spawn(process.execPath, [CLI, "serve"], { cwd: REPO, env, stdio: ["ignore", "pipe", "pipe"] });
  servers.push(child);
  let out = "";
  child.stdout!.on("data", (c: Buffer) => (out += c.toString()));
  child.stderr!.on("data", (c: Buffer) => (out += c.toString()));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const ready = eventually("the server to answer", async () => (await fetch(`${url}/api/config`).then((r) => r.ok, () => false)), 60_000);
  await Promise.race([ready, exited.then(() => Promise.reject(new Error(`the server exited:\n${out}`)))]);
  return { child, output: () => out };
}

const call = (method: string, p: string, body?: unknown) => api(url, key, method, p, body);

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(tmpdir(), "sandbar-crash-"));
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  env = {
    ...process.env,
    SANDBAR_DATA_DIR: dataDir,
    SANDBAR_PORT: String(port),
    SANDBAR_HOST: "127.0.0.1",
    SANDBAR_BOOTSTRAP_API_KEY: key,
    SANDBAR_AGENT_BUNDLE: await standInAgentBundle(),
    SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
    // The suite counts the host's sandboxes against the rows: no pool sandboxes beside them.
    SANDBAR_WARM_POOL: "0",
  };
});

afterAll(async () => {
  for (const s of servers) if (s.exitCode === null && s.signalCode === null) s.kill("SIGKILL");
  // Whatever a failed run left: the sandboxes of this data dir, then the dir.
  const rt = await openRuntime().catch(() => undefined);
  for (const s of (await rt?.list()) ?? []) await rt!.destroy(s.id).catch(() => undefined);
  await rt?.close();
  await rm(dataDir, { recursive: true, force: true });
});

it("after kill -9, a restarted server adopts, restarts or cleanly reports every sandbox, and nothing leaks", async () => {
  const first = await serve();
  const create = async (body: Record<string, unknown> = {}) => {
    const res = await call("POST", "/sandbox", body);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body.id as string;
  };
  const running: string[] = [];
  for (let i = 0; i < 5; i++) running.push(await create({ name: `run-${i}` }));
  const slowStop = await create({ name: "slow-stop", env: { STAND_IN_IGNORE_SIGTERM: "1" } });
  const stopped = await create({ name: "stopped" });
  await call("POST", `/sandbox/${stopped}/stop`);
  const archived = await create({ name: "archived" });
  await call("POST", `/sandbox/${archived}/stop`);
  expect((await call("POST", `/sandbox/${archived}/archive`)).body.state).toBe("archived");

  const rt = await openRuntime();
  for (const id of [...running, slowStop]) {
    const out = await sh({ socket: await rt.agentSocket(id), secret: rt.agentSecret(id) }, `echo ${id} > ~/marker`);
    expect(out.exitCode).toBe(0);
  }

  // Operations in flight when the server dies: a stop waiting out its grace period, a create.
  void call("POST", `/sandbox/${slowStop}/stop`).catch(() => undefined);
  await eventually("the slow stop to begin", async () => (await call("GET", `/sandbox/${slowStop}`)).body.state === "stopping");
  void call("POST", "/sandbox", { name: "in-flight" }).catch(() => undefined);
  await eventually("the create to be recorded", async () => (await call("GET", "/sandbox/in-flight")).status === 200);
  first.child.kill("SIGKILL");
  await new Promise((r) => first.child.once("exit", r));

  // While no server runs: one sandbox's processes die, and the host gains a sandbox no database knows.
  const died = running[4];
  await rt.provider.cgroups.kill(died);
  const stray = randomUUID();
  await rt.create({ id: stray, cpu: 1, memoryGiB: 1, diskGiB: 1, env: {}, user: "sandbar" });
  expect((await rt.inspect(stray))?.state).toBe("started");

  const second = await serve();
  try {
    const byName = new Map<string, { id: string; name: string; state: string; desiredState: string }>();
    for (const s of (await call("GET", "/sandbox")).body) byName.set(s.name, s);
    // Every sandbox is where it was meant to be; none is left half-way.
    for (let i = 0; i < 5; i++) expect(byName.get(`run-${i}`)?.state, `run-${i}`).toBe("started");
    expect(byName.get("slow-stop")?.state).toBe("stopped");
    expect(byName.get("stopped")?.state).toBe("stopped");
    expect(byName.get("archived")?.state).toBe("archived");
    const inFlight = byName.get("in-flight");
    if (inFlight) expect(inFlight.state).toBe("started");
    for (const s of byName.values()) expect(["started", "stopped", "archived"]).toContain(s.state);

    // Usable, with their files: the adopted ones and the one whose processes died.
    for (const id of running) {
      const out = await sh({ socket: await rt.agentSocket(id), secret: rt.agentSecret(id) }, "cat ~/marker");
      expect(out.result, id).toBe(`${id}\n`);
    }
    expect((await rt.inspect(slowStop))?.state).toBe("stopped");
    expect(await rt.inspect(stray)).toBeUndefined();
    expect(await rt.inspect(archived)).toBeUndefined();
    const onHost = new Set((await rt.list()).map((s) => s.id));
    const live = [...byName.values()].filter((s) => s.state !== "archived").map((s) => s.id);
    expect([...onHost].sort()).toEqual(live.sort());
    expect((await call("POST", `/sandbox/${archived}/start`)).body.state).toBe("started");

    // Then everything goes, and nothing of it stays on the host.
    const deleted = await Promise.all([...byName.values()].map((s) => call("DELETE", `/sandbox/${s.id}`)));
    expect(deleted.map((d) => [d.body.name.replace(/^DESTROYED_(.*)_\d+$/, "$1"), d.status, d.body.state])).toEqual([...byName.keys()].map((n) => [n, 200, "destroyed"]));
    expect(await rt.list()).toEqual([]);
    expect(await runnerLeftovers(rt)).toEqual([]);
    for (const id of [...byName.values()].map((s) => s.id).concat(stray)) {
      for (const d of rt.provider.cgroups.paths(id)) await expect(access(d)).rejects.toThrow();
    }
  } finally {
    second.child.kill("SIGTERM");
    await new Promise((r) => second.child.once("exit", r));
  }
  // The sandboxes' host uids run nothing any more.
  expect(await processesOfUids(rt.uidBase, rt.uidBase + 65_536)).toEqual([]);
  await rt.close();
});

/** The test's own view of the server's runner: same data dir, same host secret, same uids. */
async function openRuntime(): Promise<LocalRuntime> {
  return LocalRuntime.open({
    dataDir: path.join(dataDir, "runner"),
    snapshotCacheDir: TEST_SNAPSHOT_CACHE,
    init: { node: process.execPath, bundle: env.SANDBAR_AGENT_BUNDLE! },
  });
}
