import { randomUUID } from "node:crypto";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { SecretBox } from "../auth/secret-box.ts";
import { Organization, type SandboxRecord, User } from "../db/entities.ts";
import { execIn } from "../db/exec.ts";
import { insertOrganization } from "../organizations/new-organization.ts";
import { SandboxStore } from "../sandboxes/store.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { RegisteredRunners } from "./directory.ts";

// Class and GPU placement on real PostgreSQL, with two control processes (two servers, two
// connection pools, one database) racing. The runners are registered through the API and then
// marked ready as their health check would (they have no address: no health loop touches them,
// no sandbox is started on them). The sandboxes go through the store's insert with placement in
// its transaction, the path a create takes, without starting anything; the refusals a client
// sees go through POST /sandbox.

let t: TestServer;
let t2: TestServer;
let region: string;
let orgId: string;
/** A second organization: its creates do not wait on the first one's quota lock, only on the runners' rows. */
let otherOrgId: string;
const runners: Record<string, { id: string; key: string }> = {};
const call = (method: string, path: string, body?: unknown, server = t) => api(server.url, server.adminKey, method, path, body);

/** Registers a runner and makes it ready with 8 CPUs, 32 GiB and 200 GiB, as a health report would. */
async function runner(name: string, body: Record<string, unknown>): Promise<{ id: string; key: string }> {
  const r = await call("POST", "/runners", { regionId: region, name, ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  const key = `key-${name}`;
  await t.server.orm.em.getConnection().execute(`update runner set state = 'ready', runner_key = ?, cpu = 8, memory_gib = 32, disk_gib = 200 where id = ?`, [key, r.body.id]);
  return (runners[name] = { id: r.body.id, key });
}

function row(server: TestServer, over: Partial<SandboxRecord> = {}): SandboxRecord {
  const id = randomUUID();
  const now = new Date();
  return {
    id, organizationId: orgId, name: id, snapshot: "sandbar-default", osUser: "sandbar", env: {}, labels: {}, public: false,
    cpu: 1, gpu: 0, gpuType: null, sandboxClass: "container", memory: 1, disk: 3, state: "unknown", desiredState: "started", errorReason: null,
    backupState: "None", backupCreatedAt: null, autoStopInterval: 0, autoPauseInterval: 0, autoArchiveInterval: 10080, autoDeleteInterval: 0,
    createdAt: now, updatedAt: now, lastActivityAt: now, authToken: randomUUID().replace(/-/g, ""), regionId: region, runnerId: server.server.sandboxes.runtime.runnerId,
    volumes: [], imageRef: null, networkBlockAll: true, networkAllowList: null, buildInfo: null, warmPoolId: null,
    autoDestroyAt: null, recoverable: false, signingKeySealed: null, layers: null, parentId: null,
    ...over,
  };
}

/** The directory's box for runner credentials, which place() never opens (a fixed key: no database row). */
let unusedBox: Promise<SecretBox> | undefined;

/** What a create does: the row inserted with its runner chosen in the same transaction; answers where it went or the refusal. */
async function place(server: TestServer, over: Partial<SandboxRecord> = {}, gpuTypes: string[] = []): Promise<{ runner?: string; gpuType?: string | null; error?: string }> {
  const directory = new RegisteredRunners(server.server.orm, await (unusedBox ??= SecretBox.open(server.server.orm, "gpu-placement"))); // place() opens no credentials
  const store = new SandboxStore(server.server.orm);
  const r = row(server, over);
  try {
    await store.insert(r, async (exec) => {
      const p = await directory.place(exec, region, { ...r, gpuTypes });
      r.gpuType = p!.gpuType;
      return p!.runnerId;
    });
    return { runner: r.runnerId!, gpuType: r.gpuType };
  } catch (err) {
    return { error: (err as { rawMessage?: string }).rawMessage ?? String(err) };
  }
}

const keyName = (key: string | undefined) => Object.entries(runners).find(([, r]) => r.key === key)?.[0];
const clear = () => t.server.orm.em.getConnection().execute(`delete from sandbox where region_id = ?`, [region]);

beforeAll(async () => {
  t = await startTestServer();
  t2 = await startTestServer({ databaseUrl: t.server.databaseUrl, adminKey: t.adminKey });
  orgId = (await t.server.orm.em.fork().findOneOrFail(Organization, { createdBy: "sandbar-admin" })).id;
  region = (await call("POST", "/regions", { name: "gpu-fleet" })).body.id;
  const em = t.server.orm.em.fork();
  em.create(User, { id: "gpu-other", name: "Other", email: "", role: "user", createdAt: new Date() });
  await em.flush();
  otherOrgId = await insertOrganization(execIn(em), { name: "Other", createdBy: "gpu-other", personal: false });
  await runner("plain", {});
  await runner("h100", { gpu: 2, gpuType: "H100" });
  await runner("rtx1", { gpu: 1, gpuType: "RTX-PRO-6000" });
  await runner("vm1", { sandboxClass: "linux-vm" });
}, 120_000);

afterAll(async () => {
  await t2?.stop();
  await t?.stop();
});

describe("class and GPU placement", () => {
  afterEach(clear);

  it("shows each runner's class and GPUs in GET /runners", async () => {
    const list = (await call("GET", `/runners?regionId=${region}`)).body as Array<Record<string, unknown>>;
    const byName = Object.fromEntries(list.map((r) => [r.name, r]));
    expect(byName.plain).toMatchObject({ sandboxClass: "container", runnerClass: "container" });
    expect(byName.plain!.gpu ?? 0).toBe(0);
    expect(byName.h100).toMatchObject({ sandboxClass: "container", gpu: 2, gpuType: "H100" });
    expect(byName.rtx1).toMatchObject({ gpu: 1, gpuType: "RTX-PRO-6000" });
    expect(byName.vm1).toMatchObject({ sandboxClass: "linux-vm" });
  });

  it("a GPU sandbox lands only on a GPU runner, never beyond its GPUs, even with twelve creates at once from two control processes", async () => {
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => place(i % 2 ? t2 : t, { gpu: 1 })));
    const placed = answers.filter((a) => a.runner);
    // Three GPUs in the region (two H100, one RTX PRO 6000): three creates win.
    expect(placed).toHaveLength(3);
    const per: Record<string, number> = {};
    for (const a of placed) per[keyName(a.runner)!] = (per[keyName(a.runner)!] ?? 0) + 1;
    expect(per).toEqual({ h100: 2, rtx1: 1 });
    for (const a of placed) expect(a.gpuType).toBe(keyName(a.runner) === "h100" ? "H100" : "RTX-PRO-6000");
    for (const a of answers.filter((x) => x.error)) expect(a.error).toBe("No available runners");
    // Counted as GET /runners shows it: allocated CPU of the GPU runners.
    expect((await call("GET", `/runners/${runners.h100!.id}`)).body.currentAllocatedCpu).toBe(2);
  });

  it("a GPU type preference is kept in order and pins the model; an unmet one says which types", async () => {
    expect(await place(t, { gpu: 1 }, ["RTX-PRO-6000", "H100"])).toMatchObject({ runner: runners.rtx1!.key, gpuType: "RTX-PRO-6000" });
    expect(await place(t, { gpu: 1 }, ["RTX-PRO-6000", "H100"])).toMatchObject({ runner: runners.h100!.key, gpuType: "H100" });
    expect(await place(t, { gpu: 1 }, ["RTX-PRO-6000"])).toEqual({ error: "No available runners with GPU type: RTX-PRO-6000" });
    expect(await place(t, { gpu: 1 }, ["B300"])).toEqual({ error: "No available runners with GPU type: B300" });
  });

  it("a sandbox without GPU never takes a GPU runner: once the plain runner is full, it is refused", async () => {
    // The plain container runner has 8 CPUs; sandboxes of 4 CPUs: two fit, with the GPU runners idle.
    const answers = await Promise.all([t, t2, t, t2].map((s) => place(s, { cpu: 4 })));
    expect(answers.filter((a) => a.runner).map((a) => keyName(a.runner))).toEqual(["plain", "plain"]);
    expect(answers.filter((a) => a.error).map((a) => a.error)).toEqual(["No available runners", "No available runners"]);
  });

  it("a class goes only to runners of that class; android to container runners; none of the class: No available runners", async () => {
    expect(keyName((await place(t, { sandboxClass: "linux-vm" })).runner)).toBe("vm1");
    expect(keyName((await place(t, { sandboxClass: "android" })).runner)).toBe("plain");
    expect(keyName((await place(t, { sandboxClass: "container" })).runner)).toBe("plain");
    expect(await place(t, { sandboxClass: "windows" })).toEqual({ error: "No available runners" });
    // A GPU linux-vm: the vm runner has no GPU.
    expect(await place(t, { sandboxClass: "linux-vm", gpu: 1 })).toEqual({ error: "No available runners" });
  });

  it("two control processes racing for the last GPU (for two organizations): exactly one wins, every round", async () => {
    for (let round = 0; round < 5; round++) {
      // Two of the three GPUs taken: one left.
      expect((await place(t, { gpu: 1 }, ["H100"])).runner).toBe(runners.h100!.key);
      expect((await place(t, { gpu: 1 }, ["H100"])).runner).toBe(runners.h100!.key);
      // Two organizations, two control processes: only the runner rows' lock stands between them.
      const race = await Promise.all([place(t, { gpu: 1 }), place(t2, { gpu: 1, organizationId: otherOrgId })]);
      expect(race.filter((a) => a.runner).map((a) => keyName(a.runner))).toEqual(["rtx1"]);
      expect(race.filter((a) => a.error).map((a) => a.error)).toEqual(["No available runners"]);
      await clear();
    }
  });

  it("refuses through POST /sandbox with the reference's words and the fields' names", async () => {
    const create = (body: Record<string, unknown>) => call("POST", "/sandbox", { target: "gpu-fleet", autoDeleteInterval: 0, ...body });
    const refused = async (body: Record<string, unknown>, message: string) => {
      const r = await create(body);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.message).toBe(message);
    };
    await refused({ class: "windows" }, "No available runners");
    await refused({ class: "linux-vm", gpu: 1 }, "No available runners");
    await refused({ gpu: 1, gpuType: ["B300"] }, "No available runners with GPU type: B300");
    await refused({ class: "mainframe" }, "class must be one of the following values: container, linux-vm, android, windows");
    await refused({ gpu: -1 }, "gpu must not be less than 0");
    await refused({ gpu: 2 }, "gpu must not be greater than 1");
    await refused({ gpu: 1, autoDeleteInterval: -1 }, "GPU sandboxes must be ephemeral - set autoDeleteInterval to 0");
    await refused({ gpuType: ["H100"] }, "gpuType is only allowed with gpu: 1 (it chooses the model of the sandbox's GPU)");
    await refused({ class: "android" }, "Android sandboxes must be linked to another sandbox");
    const badType = await create({ gpu: 1, gpuType: ["H999"] });
    expect(badType.status).toBe(400);
    expect(badType.body.message).toContain("gpuType must be one of the following values: H100, RTX-PRO-6000");
    // The server's own region: its GPU quota first (0, the reference's default), as the reference orders them.
    const overQuota = await call("POST", "/sandbox", { gpu: 1, autoDeleteInterval: 0 });
    expect([overQuota.status, overQuota.body.message]).toEqual([403, "Total GPU limit exceeded. Maximum allowed: 0."]);
    // Quotas are per class: the organization has none for linux-vm there (the reference's answer).
    const vm = await call("POST", "/sandbox", { class: "linux-vm" });
    expect([vm.status, vm.body.message]).toEqual([403, "Region local is not available to the organization for class linux-vm"]);
    // Within quota, its in-process runtime is a container runner without GPUs.
    const db = t.server.orm.em.getConnection();
    await db.execute(`update region_quota set total_gpu_quota = 1 where organization_id = ? and region_id = 'local'`, [orgId]);
    try {
      const local = await call("POST", "/sandbox", { gpu: 1, autoDeleteInterval: 0 });
      expect([local.status, local.body.message]).toEqual([400, "No available runners"]);
    } finally {
      await db.execute(`update region_quota set total_gpu_quota = 0 where organization_id = ? and region_id = 'local'`, [orgId]);
    }
    expect(((await db.execute(`select count(*)::int as n from sandbox where region_id = 'local'`)) as Array<{ n: number }>)[0]!.n).toBe(0);
    // Nothing was left behind by the refusals.
    expect(((await t.server.orm.em.getConnection().execute(`select count(*)::int as n from sandbox where region_id = ?`, [region])) as Array<{ n: number }>)[0]!.n).toBe(0);
  });

  it("checks a runner's class and GPU type at registration, naming the field", async () => {
    const bad = async (body: Record<string, unknown>, message: string) => {
      const r = await call("POST", "/runners", { regionId: region, name: "bad-runner", ...body });
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.message).toContain(message);
    };
    await bad({ sandboxClass: "mainframe" }, "sandboxClass must be one of the following values");
    await bad({ sandboxClass: "android" }, "sandboxClass must be one of the following values: container, linux-vm, windows");
    await bad({ gpu: 1, gpuType: "GTX-280" }, "gpuType must be one of the following values: H100, RTX-PRO-6000");
    await bad({ gpu: -1 }, "gpu must be a whole number from 0 to 1000000");
  });

  it("counts a GPU sandbox against the organization's GPU quota where the region enforces quotas", async () => {
    // The shared region `local` enforces quotas; the organization's GPU quota there is 0 (the reference's default).
    const quota = ((await t.server.orm.em.getConnection().execute(`select total_gpu_quota from region_quota where organization_id = ? and region_id = 'local'`, [orgId])) as Array<{ total_gpu_quota: number }>)[0];
    expect(quota?.total_gpu_quota).toBe(0);
    const r = row(t, { gpu: 1, regionId: "local" });
    await expect(new SandboxStore(t.server.orm).insert(r)).rejects.toThrow("Total GPU limit exceeded. Maximum allowed: 0.");
  });
});
