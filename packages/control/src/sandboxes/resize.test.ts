import { readFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { reconcile } from "./reconcile.ts";
import { type SandboxDto, type SandboxFixture, sandboxFixture } from "./testing/fixtures.ts";

// POST /sandbox/{id}/resize with real sandboxes: the reference's rules and messages, cpu and
// memory raised in a running sandbox's cgroup (read back from the kernel's files, from the
// sandbox's health, and felt by a process inside), the disk grown while stopped, the quotas, and
// the new size kept across a restart.

let f: SandboxFixture;
const GiB = 2 ** 30;

beforeAll(async () => {
  f = await sandboxFixture();
}, 120_000);

afterAll(async () => {
  await f?.stop();
});

/** A limit file of the sandbox's cgroup on the host, from whichever hierarchy has it. */
async function cgroupValue(id: string, v1: string, v2: string): Promise<number> {
  const cg = f.runtime.provider.cgroups;
  for (const dir of cg.paths(id)) {
    const text = await readFile(path.join(dir, cg.version === "v2" ? v2 : v1), "utf8").catch(() => undefined);
    if (text !== undefined) return Number(text.trim().split(/\s+/)[0]);
  }
  throw new Error(`no ${v1} for sandbox ${id}`);
}
const memoryLimit = (id: string) => cgroupValue(id, "memory.limit_in_bytes", "memory.max");
const cpuQuotaUs = (id: string) => cgroupValue(id, "cpu.cfs_quota_us", "cpu.max");

const resize = (id: string, body: unknown, route = "sandbox") => f.call("POST", `/${route}/${id}/resize`, body);

async function refused(id: string, body: unknown, status: number, message: string | RegExp): Promise<void> {
  const res = await resize(id, body);
  expect(res.status, JSON.stringify(body)).toBe(status);
  if (typeof message === "string") expect(res.body.message, JSON.stringify(body)).toBe(message);
  else expect(res.body.message, JSON.stringify(body)).toMatch(message);
}

/** Holds `bytes` inside the sandbox in one process: its exit code (137 when the OOM killer ends it). */
async function hold(id: string, mib: number): Promise<number> {
  const js = `const a = []; for (let i = 0; i < ${mib / 16}; i++) a.push(Buffer.alloc(16 << 20, 1)); console.log(a.length)`;
  return (await f.exec(id, `/opt/sandbar/bin/node -e '${js}' >/dev/null 2>&1; echo $?`)).result.trim() === "0" ? 0 : 137;
}

describe("resize", () => {
  let a: SandboxDto;

  it("refuses bad input with a message naming the field, and unknown sandboxes with 404", async () => {
    a = await f.create({ cpu: 1, memory: 1, disk: 3 });
    const cases: [unknown, RegExp][] = [
      [{ cpu: 0 }, /^cpu must not be less than 1$/],
      [{ memory: -2 }, /^memory must not be less than 1$/],
      [{ disk: 0, cpu: 0 }, /^cpu must not be less than 1, disk must not be less than 1$/],
      [{ cpu: "two" }, /^cpu must be a number$/],
      [{ memory: 1.5 }, /^memory must be an integer number$/], // whole cores and GiB, as the sandbox table holds them
      [{ disk: 2 ** 40 }, /^disk is out of range$/],
      [{ cpu: null, memory: [1] }, /^memory must be a number$/],
      ["not json", /^Invalid JSON in request body$/],
    ];
    for (const [body, message] of cases) await refused(a.id, body, 400, message);
    await refused("00000000-0000-4000-8000-000000000000", { cpu: 2 }, 404, "Sandbox with ID or name 00000000-0000-4000-8000-000000000000 not found");
    const other = await f.otherOrganization();
    for (const body of [{ cpu: 2 }, { cpu: 0 }, {}]) expect((await f.call("POST", `/sandbox/${a.id}/resize`, body, other.key)).status).toBe(404);
    // Nothing changed.
    expect((await f.call("GET", `/sandbox/${a.id}`)).body).toMatchObject({ cpu: 1, memory: 1, disk: 3, state: "started" });
  });

  it("raises cpu and memory of a running sandbox while a process runs: the cgroup, the DTO and the process see it", async () => {
    const bg = await f.exec(a.id, "sleep 600 >/dev/null 2>&1 </dev/null & echo $!");
    const pid = bg.result.trim();
    expect(pid).toMatch(/^\d+$/);
    expect(await memoryLimit(a.id)).toBe(GiB);
    expect(await cpuQuotaUs(a.id)).toBe(100_000);
    expect(await hold(a.id, 1280)).toBe(137); // 1.25 GiB does not fit in 1 GiB
    const hook = await f.call("POST", `/webhooks/organizations/${f.orgId}/endpoints`, { url: "https://hooks.example.com/sandbar", eventTypes: ["sandbox.state.updated"] });
    expect(hook.status, JSON.stringify(hook.body)).toBeLessThan(300);

    const res = await resize(a.id, { cpu: 2, memory: 2 });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ id: a.id, state: "started", cpu: 2, memory: 2, disk: 3 });
    expect(await memoryLimit(a.id)).toBe(2 * GiB);
    expect(await cpuQuotaUs(a.id)).toBe(200_000);
    const got = (await f.call("GET", `/sandbox/${a.id}`)).body;
    expect(got).toMatchObject({ state: "started", cpu: 2, memory: 2 });
    expect(Number(got.health.memoryLimitBytes)).toBe(2 * GiB);
    // The process started before the resize still runs, and 1.25 GiB fits now.
    expect((await f.exec(a.id, `kill -0 ${pid} && echo alive`)).result.trim()).toBe("alive");
    expect(await hold(a.id, 1280)).toBe(0);
    // The state changes went out as the reference's sandbox.state.updated events.
    const events = (await f.t.server.orm.em.fork().getConnection().execute(
      `select body from webhook_message where event_type = 'sandbox.state.updated' and body::jsonb ->> 'id' = ? order by created_at`,
      [a.id],
    )) as Array<{ body: string }>;
    expect(events.map((e) => JSON.parse(e.body) as { oldState: string; newState: string }).map((e) => `${e.oldState}>${e.newState}`)).toEqual(["started>resizing", "resizing>started"]);
    expect((await f.call("DELETE", `/webhooks/organizations/${f.orgId}/endpoints/${hook.body.endpoint.id}`)).status).toBeLessThan(300);
  });

  it("refuses on a running sandbox what the reference refuses, with its messages", async () => {
    await refused(a.id, {}, 400, "No resource changes specified - sandbox is already at the desired configuration");
    await refused(a.id, { cpu: 2, memory: 2, disk: 3 }, 400, "No resource changes specified - sandbox is already at the desired configuration");
    await refused(a.id, { disk: 4 }, 400, "Disk resize can only be performed on a stopped sandbox");
    await refused(a.id, { cpu: 1 }, 400, "Sandbox must be in stopped state to decrease the number of CPU cores");
    await refused(a.id, { memory: 1, cpu: 3 }, 400, "Sandbox must be in stopped state to decrease memory");
    // Another operation in progress: 409.
    let release!: () => void;
    const held = f.manager.locks.tryRun(a.id, () => new Promise<void>((r) => (release = r)))!;
    await refused(a.id, { cpu: 3 }, 409, "Sandbox state change in progress");
    release();
    await held;
    expect((await f.call("GET", `/sandbox/${a.id}`)).body).toMatchObject({ state: "started", cpu: 2, memory: 2, disk: 3 });
  });

  it("checks the organization's quotas: per sandbox (400) and totals (403)", async () => {
    await refused(a.id, { cpu: 5 }, 400, /^CPU request 5 exceeds maximum allowed per sandbox \(4\)/);
    await refused(a.id, { memory: 9 }, 400, /^Memory request 9GB exceeds maximum allowed per sandbox \(8GB\)/);
    const usage = (await f.call("GET", `/organizations/${f.orgId}/usage`)).body.regionUsage[0];
    const quota = (q: Record<string, number>) => f.call("PATCH", `/organizations/${f.orgId}/quota`, q);
    expect((await quota({ totalMemoryQuota: usage.currentMemoryUsage, totalCpuQuota: usage.currentCpuUsage })).status).toBe(200);
    try {
      await refused(a.id, { memory: 3 }, 403, /^Total memory limit exceeded\. Maximum allowed: \d+GiB\./);
      await refused(a.id, { cpu: 3 }, 403, /^Total CPU limit exceeded\. Maximum allowed: \d+\./);
    } finally {
      expect((await quota({ totalMemoryQuota: 10, totalCpuQuota: 10 })).status).toBe(200);
    }
    expect((await f.call("GET", `/sandbox/${a.id}`)).body).toMatchObject({ state: "started", cpu: 2, memory: 2 });
    expect(await memoryLimit(a.id)).toBe(2 * GiB);
  });

  it("keeps the new size across a stop and start", async () => {
    expect((await f.call("POST", `/sandbox/${a.id}/stop`)).status).toBe(200);
    const started = await f.call("POST", `/sandbox/${a.id}/start`);
    expect(started.body).toMatchObject({ state: "started", cpu: 2, memory: 2 });
    expect(await memoryLimit(a.id)).toBe(2 * GiB);
    expect(await cpuQuotaUs(a.id)).toBe(200_000);
  });

  it("on a stopped sandbox: cpu and memory go down, the disk grows, and a file larger than the old cap fits after start", async () => {
    const b = await f.create({ cpu: 2, memory: 2, disk: 1 });
    expect((await f.exec(b.id, "echo kept > ~/kept; fallocate -l 1200M ~/big 2>&1; echo rc=$?; rm -f ~/big")).result).toMatch(/No space left on device[\s\S]*rc=1/);
    expect((await f.call("POST", `/sandbox/${b.id}/stop`)).status).toBe(200);

    await refused(b.id, { disk: 11 }, 400, /^Disk request 11GB exceeds maximum allowed per sandbox \(10GB\)/);
    const usage = (await f.call("GET", `/organizations/${f.orgId}/usage`)).body.regionUsage[0];
    expect((await f.call("PATCH", `/organizations/${f.orgId}/quota`, { totalDiskQuota: usage.currentDiskUsage })).status).toBe(200);
    try {
      await refused(b.id, { disk: 2 }, 403, /^Total disk limit exceeded\. Maximum allowed: \d+GiB\./);
    } finally {
      expect((await f.call("PATCH", `/organizations/${f.orgId}/quota`, { totalDiskQuota: 30 })).status).toBe(200);
    }

    const res = await resize(b.id, { cpu: 1, memory: 1, disk: 2 }, "workspace");
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ state: "stopped", cpu: 1, memory: 1, disk: 2 });
    await refused(b.id, { disk: 1 }, 400, "Sandbox disk size cannot be decreased");

    const started = await f.call("POST", `/sandbox/${b.id}/start`);
    expect(started.body).toMatchObject({ state: "started", cpu: 1, memory: 1, disk: 2 });
    expect(await memoryLimit(b.id)).toBe(GiB);
    expect(await cpuQuotaUs(b.id)).toBe(100_000);
    const out = (await f.exec(b.id, "fallocate -l 1200M ~/big 2>&1; echo rc=$?; cat ~/kept; df -BM / | tail -1")).result;
    expect(out).toMatch(/^rc=0\nkept\n/);
    const sizeMb = Number(out.trim().split("\n")[2]!.split(/\s+/)[1]!.replace("M", ""));
    expect(sizeMb).toBeGreaterThan(1900);
    expect(sizeMb).toBeLessThanOrEqual(2048);
  });

  it("refuses an archived sandbox; one resized before its archive comes back with its new size", async () => {
    const c = await f.create({});
    expect((await f.call("POST", `/sandbox/${c.id}/stop`)).status).toBe(200);
    expect((await resize(c.id, { memory: 2, disk: 4 })).body).toMatchObject({ state: "stopped", memory: 2, disk: 4 });
    expect((await f.call("POST", `/sandbox/${c.id}/archive`)).status).toBe(200);
    await refused(c.id, { cpu: 2 }, 400, "Sandbox must be in started or stopped state to resize");
    const restored = await f.call("POST", `/sandbox/${c.id}/start`);
    expect(restored.body).toMatchObject({ state: "started", cpu: 1, memory: 2, disk: 4 });
    expect(await memoryLimit(c.id)).toBe(2 * GiB);
    const df = (await f.exec(c.id, "df -BG / | tail -1")).result.trim().split(/\s+/);
    expect(df[1]).toBe("4G");
  });

  it("reconcile finishes a resize a crash interrupted (the row holds the new size, the host the old one)", async () => {
    const running = await f.create({ cpu: 1, memory: 1 });
    const stopped = await f.create({ disk: 3 });
    expect((await f.call("POST", `/sandbox/${stopped.id}/stop`)).status).toBe(200);
    await f.manager.store.update(running.id, { state: "resizing", cpu: 2, memory: 2 });
    await f.manager.store.update(stopped.id, { state: "resizing", disk: 5 });
    expect((await f.call("GET", `/sandbox/${running.id}`)).body.state).toBe("resizing");

    const report = await reconcile(f.manager);
    expect(report.failed).toEqual([]);
    expect(report.resumed).toEqual(expect.arrayContaining([running.id, stopped.id]));
    expect((await f.call("GET", `/sandbox/${running.id}`)).body).toMatchObject({ state: "started", cpu: 2, memory: 2 });
    expect(await memoryLimit(running.id)).toBe(2 * GiB);
    expect(await cpuQuotaUs(running.id)).toBe(200_000);
    expect((await f.call("GET", `/sandbox/${stopped.id}`)).body).toMatchObject({ state: "stopped", disk: 5 });
    expect((await f.call("POST", `/sandbox/${stopped.id}/start`)).body.state).toBe("started");
    expect((await f.exec(stopped.id, "df -BG / | tail -1")).result.trim().split(/\s+/)[1]).toBe("5G");
  });
});
