import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually } from "../sandboxes/testing/fixtures.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { createTestNetns, type TestNetns } from "./testing/netns.ts";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerProcess, registerRunnerProcess } from "./testing/runner-process.ts";

// GPU placement end to end: two real `sandbar runner` processes, each in a network namespace of
// its own, each offering 2 CPUs, 4 GiB and 20 GiB; one of them told it has one H100
// (SANDBAR_RUNNER_GPU=1, SANDBAR_RUNNER_GPU_TYPE=H100: this machine has no GPU, so the runner
// reports what it is told; no device reaches the sandbox). Control learns the GPUs from the
// runner's health report, not from the registration.

const root = process.getuid?.() === 0;
let t: TestServer;
let region: string;
const namespaces: TestNetns[] = [];
const runners: Record<string, { process: RunnerProcess; id: string; key: string }> = {};
const call = (method: string, path: string, body?: unknown) => api(t.url, t.adminKey, method, path, body);

async function register(name: string, index: number, env: NodeJS.ProcessEnv): Promise<void> {
  const netns = createTestNetns(index);
  namespaces.push(netns);
  const { process, id } = await registerRunnerProcess(call, {
    regionId: region,
    name,
    subnet: `10.${216 + index * 2}.0.0/24`,
    netns,
    env: { SANDBAR_RUNNER_CPU: "2", SANDBAR_RUNNER_MEMORY_GIB: "4", SANDBAR_RUNNER_DISK_GIB: "20", ...env },
  });
  const remote = await RemoteRuntime.open({ url: process.url, credential: process.credential });
  runners[name] = { process, id, key: remote.runnerId };
  await remote.close();
}

const create = (body: Record<string, unknown> = {}) => call("POST", "/sandbox", { target: "gpu-real", cpu: 1, memory: 1, disk: 3, autoStopInterval: 0, ...body });
const gpuCreate = () => create({ gpu: 1, autoDeleteInterval: 0 });

beforeAll(async () => {
  if (!root) return;
  t = await startTestServer({ settings: { runnerChecks: { intervalMs: 200, unresponsiveMs: 1500 } } });
  region = (await call("POST", "/regions", { name: "gpu-real" })).body.id;
  await register("gpu-a", 1, { SANDBAR_RUNNER_GPU: "1", SANDBAR_RUNNER_GPU_TYPE: "H100" });
  await register("plain-b", 2, { SANDBAR_RUNNER_GPU: "0" });
  for (const r of Object.values(runners)) await eventually(`${r.id} to be ready`, async () => (await call("GET", `/runners/${r.id}`)).body.state === "ready", 30_000);
}, 180_000);

afterAll(async () => {
  if (t) for (const s of (await call("GET", "/sandbox")).body ?? []) await call("DELETE", `/sandbox/${s.id}`);
  await t?.stop();
  for (const r of Object.values(runners)) await r.process.stop();
  for (const n of namespaces) n.remove();
}, 120_000);

describe.skipIf(!root)("GPU placement on runner processes", () => {
  it("GET /runners shows the GPUs each runner reported and its class", async () => {
    expect((await call("GET", `/runners/${runners["gpu-a"]!.id}`)).body).toMatchObject({ gpu: 1, gpuType: "H100", sandboxClass: "container", state: "ready" });
    const plain = (await call("GET", `/runners/${runners["plain-b"]!.id}`)).body;
    expect(plain).toMatchObject({ sandboxClass: "container", state: "ready" });
    expect(plain.gpu ?? 0).toBe(0);
    expect(plain.gpuType ?? null).toBeNull();
  });

  it("a GPU sandbox runs on the GPU runner, pinned to its model; a second finds no GPU free; sandboxes without GPU never go there", async () => {
    const [g1, g2] = await Promise.all([gpuCreate(), gpuCreate()]);
    const won = [g1!, g2!].filter((r) => r.status === 200);
    const lost = [g1!, g2!].filter((r) => r.status !== 200);
    expect(won).toHaveLength(1);
    expect(lost.map((r) => [r.status, r.body.message])).toEqual([[400, "No available runners"]]);
    const gpu = won[0]!.body;
    expect(gpu).toMatchObject({ state: "started", gpu: 1, gpuType: "H100", sandboxClass: "container", runnerId: runners["gpu-a"]!.key });
    expect((await call("POST", `/toolbox/${gpu.id}/toolbox/process/execute`, { command: "echo gpu-box" })).body).toMatchObject({ exitCode: 0, result: "gpu-box\n" });
    expect((await call("GET", `/sandbox/${gpu.id}`)).body).toMatchObject({ gpu: 1, gpuType: "H100", sandboxClass: "container" });

    // The GPU runner has a CPU free, but takes only GPU sandboxes: two fit on plain-b, then none.
    const plain = await Promise.all([create(), create(), create()]);
    expect(plain.filter((r) => r.status === 200).map((r) => r.body.runnerId)).toEqual([runners["plain-b"]!.key, runners["plain-b"]!.key]);
    expect(plain.filter((r) => r.status !== 200).map((r) => r.body.message)).toEqual(["No available runners"]);
    for (const r of plain.filter((x) => x.status === 200)) expect(r.body).toMatchObject({ gpu: 0, sandboxClass: "container" });

    // Its GPU is free again once the sandbox is gone.
    expect((await call("DELETE", `/sandbox/${gpu.id}`)).status).toBeLessThan(300);
    await eventually("the GPU sandbox gone", async () => {
      const r = await call("GET", `/sandbox/${gpu.id}`);
      return r.status === 404 || r.body.state === "destroyed";
    }, 30_000);
    const again = await gpuCreate();
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    expect(again.body.runnerId).toBe(runners["gpu-a"]!.key);
  }, 240_000);

  it("a class no runner of the region has: No available runners", async () => {
    const r = await create({ class: "linux-vm" });
    expect([r.status, r.body.message]).toEqual([400, "No available runners"]);
  });
});
