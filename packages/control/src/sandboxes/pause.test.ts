import { rm } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execIn } from "../db/exec.ts";
import { regionUsage } from "../organizations/usage.ts";
import { reconcile } from "./reconcile.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";
import { leftovers } from "./testing/leaks.ts";

// Pause and resume through control (reference 0.218: POST /sandbox/{id}/pause, start resumes,
// POST /sandbox/{id}/autopause/{interval}) on real sandboxes: states and events, quota, the
// toolbox's auto-resume, stop and delete of a paused sandbox, and a restart of the server.
// The timer clock is scaled: one "minute" is 400 ms.

const clock = { timerMinuteMs: 400, timerTickMs: 100 };

let f: SandboxFixture;
beforeAll(async () => {
  f = await sandboxFixture(clock);
});
afterAll(() => f?.stop());

const pause = (id: string) => f.call("POST", `/sandbox/${id}/pause`);
const stateOf = async (id: string) => (await f.call("GET", `/sandbox/${id}`)).body.state as string;

/** The sandbox.state.updated events of a sandbox, as `old>new`. */
async function transitions(id: string): Promise<string[]> {
  const rows = (await f.t.server.orm.em.fork().getConnection().execute(
    `select body from webhook_message where event_type = 'sandbox.state.updated' and body::jsonb ->> 'id' = ? order by created_at`,
    [id],
  )) as Array<{ body: string }>;
  return rows.map((r) => JSON.parse(r.body) as { oldState: string; newState: string }).map((e) => `${e.oldState}>${e.newState}`);
}

async function cpuInUse(): Promise<number> {
  const [usage] = await regionUsage(execIn(f.t.server.orm.em.fork()), f.orgId, "local");
  return usage!.cpu;
}

describe("pause and resume", () => {
  beforeAll(async () => {
    // An endpoint subscribed to state changes: the events are written for it (and not delivered in a test).
    const hook = await f.call("POST", `/webhooks/organizations/${f.orgId}/endpoints`, { url: "https://hooks.example.com/sandbar", eventTypes: ["sandbox.state.updated"] });
    expect(hook.status, JSON.stringify(hook.body)).toBeLessThan(300);
  });

  it("pause freezes the sandbox and answers it paused; a second pause is a no-op; start resumes it; each change is an event", async () => {
    const s = await f.create({ autoStopInterval: 0 });
    await f.exec(s.id, "echo kept > ~/f");
    const cpuBefore = await cpuInUse();

    const res = await pause(s.id);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ id: s.id, state: "paused", desiredState: "paused", autoPauseInterval: 0 });
    expect((await f.runtime.provider.inspect(s.id)).state).toBe("paused");
    expect(await f.runtime.provider.cgroups.frozen(s.id)).toBe(true);
    // A paused sandbox holds its disk, not its cpu.
    expect(await cpuInUse()).toBe(cpuBefore - 1);

    const again = await pause(s.id);
    expect(again.status).toBe(200);
    expect(again.body.state).toBe("paused");

    const started = await f.call("POST", `/sandbox/${s.id}/start`);
    expect(started.status, JSON.stringify(started.body)).toBe(200);
    expect(started.body.state).toBe("started");
    expect(await f.runtime.provider.cgroups.frozen(s.id)).toBe(false);
    expect((await f.exec(s.id, "cat ~/f")).result).toBe("kept\n");
    expect(await cpuInUse()).toBe(cpuBefore);
    expect((await transitions(s.id)).slice(-4)).toEqual(["started>pausing", "pausing>paused", "paused>resuming", "resuming>started"]);
  });

  it("refuses to pause a sandbox that is not started; stop and delete work on a paused one", async () => {
    const s = await f.create({ autoStopInterval: 0 });
    await f.call("POST", `/sandbox/${s.id}/stop`);
    const refused = await pause(s.id);
    expect(refused.status).toBe(400);
    expect(refused.body.message).toBe("Sandbox must be in started state to pause");
    expect((await pause("no-such-sandbox")).status).toBe(404);

    await f.call("POST", `/sandbox/${s.id}/start`);
    await f.exec(s.id, "(sleep 600 >/dev/null 2>&1 &)");
    expect((await pause(s.id)).body.state).toBe("paused");
    const { hostUid } = await f.runtime.provider.inspect(s.id);
    const stopped = await f.call("POST", `/sandbox/${s.id}/stop`);
    expect(stopped.status, JSON.stringify(stopped.body)).toBe(200);
    await eventually("the paused sandbox to stop", async () => (await stateOf(s.id)) === "stopped");
    expect((await f.runtime.provider.inspect(s.id)).state).toBe("stopped");
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");

    expect((await pause(s.id)).body.state).toBe("paused");
    // Not while paused: what needs a running or a stopped sandbox says so.
    expect((await f.call("POST", `/sandbox/${s.id}/archive`)).body.message).toBe("Sandbox is not stopped");
    expect((await f.call("DELETE", `/sandbox/${s.id}`)).body.state).toBe("destroyed");
    expect(await leftovers(f.runtime, s.id, hostUid)).toEqual([]);
  });

  it("a toolbox call to a paused sandbox resumes it and waits; concurrent calls share one resume", async () => {
    const s = await f.create({ autoStopInterval: 0 });
    await f.exec(s.id, "echo before > ~/f");
    await pause(s.id);
    const outs = await Promise.all([1, 2, 3, 4, 5].map((i) => f.exec(s.id, `cat ~/f; echo ${i}`)));
    expect(outs.map((o) => o.result)).toEqual([1, 2, 3, 4, 5].map((i) => `before\n${i}\n`));
    expect(await stateOf(s.id)).toBe("started");
    const row = await f.manager.store.byId(s.id);
    expect(row).toMatchObject({ state: "started", desiredState: "started" });
    // One resume for the five calls.
    expect((await transitions(s.id)).filter((t) => t.startsWith("paused>") || t.startsWith("resuming>"))).toEqual(["paused>resuming", "resuming>started"]);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });

  it("a toolbox call that arrives while the sandbox is being paused waits for the pause, then resumes it", async () => {
    const s = await f.create({ autoStopInterval: 0 });
    // The host's pause held until the call has arrived: the row reads `pausing` meanwhile.
    const hostPause = f.runtime.pause;
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    f.runtime.pause = async (id) => {
      await gate;
      return hostPause.call(f.runtime, id);
    };
    try {
      const pausing = pause(s.id);
      await eventually("the pause to be under way", async () => (await stateOf(s.id)) === "pausing", 10_000);
      const call = f.exec(s.id, "echo through");
      open();
      expect((await call).result).toBe("through\n");
      expect((await pausing).body.state).toBe("paused"); // the pause's own answer
    } finally {
      f.runtime.pause = hostPause;
      open();
    }
    expect(await stateOf(s.id)).toBe("started");
    await f.call("DELETE", `/sandbox/${s.id}`);
  });

  it("auto-pause: set by route or at create, exclusive with auto-stop, pauses an idle sandbox that the next call resumes", async () => {
    const withStop = await f.create({});
    const refused = await f.call("POST", `/sandbox/${withStop.id}/autopause/1`);
    expect(refused.status).toBe(400);
    expect(refused.body.message).toBe("autoStopInterval and autoPauseInterval are mutually exclusive. Set at most one of them to a non-zero value");
    expect((await f.call("POST", `/sandbox/${withStop.id}/autopause/-1`)).status).toBe(400);
    expect((await f.call("POST", `/sandbox/${withStop.id}/autopause/0`)).body.autoPauseInterval).toBe(0);
    await f.call("DELETE", `/sandbox/${withStop.id}`);
    expect((await f.call("POST", "/sandbox", { autoStopInterval: 5, autoPauseInterval: 5 })).status).toBe(400);

    const s = await f.create({ autoPauseInterval: 3 });
    expect(s).toMatchObject({ autoStopInterval: 0, autoPauseInterval: 3 });
    await eventually("the idle sandbox to be paused", async () => (await stateOf(s.id)) === "paused", 15_000);
    expect((await f.exec(s.id, "echo woke")).result).toBe("woke\n");
    expect(await stateOf(s.id)).toBe("started");

    const set = await f.create({ autoStopInterval: 0 });
    const res = await f.call("POST", `/sandbox/${set.id}/autopause/1`);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.autoPauseInterval).toBe(1);
    await eventually("the sandbox to be auto-paused", async () => (await stateOf(set.id)) === "paused", 15_000);
    for (const id of [s.id, set.id]) await f.call("DELETE", `/sandbox/${id}`);
  });
});

describe("reconcile", () => {
  it("finishes an interrupted pause and an interrupted resume, and stops a paused sandbox whose processes ended", async () => {
    const pausing = await f.create({ autoStopInterval: 0 });
    await f.manager.store.update(pausing.id, { desiredState: "paused" });
    const resuming = await f.create({ autoStopInterval: 0 });
    await pause(resuming.id);
    await f.manager.store.update(resuming.id, { desiredState: "started" });
    const ended = await f.create({ autoStopInterval: 0 });
    await f.exec(ended.id, "echo files > ~/f");
    await pause(ended.id);
    await f.runtime.provider.cgroups.kill(ended.id); // what a reboot does to its processes

    // The interrupted pause and resume are finished by reconcile at a start, or before it by
    // recovery.ts (what every control process does for operations a dead process left).
    const report = await reconcile(f.manager);
    expect(report.resumed).toContain(ended.id);
    await eventually("the interrupted pause finished", async () => (await stateOf(pausing.id)) === "paused");
    expect(await f.runtime.provider.cgroups.frozen(pausing.id)).toBe(true);
    await eventually("the interrupted resume finished", async () => (await stateOf(resuming.id)) === "started");
    expect(await f.runtime.provider.cgroups.frozen(resuming.id)).toBe(false);
    expect(await stateOf(ended.id)).toBe("stopped");
    expect((await f.call("POST", `/sandbox/${ended.id}/start`)).body.state).toBe("started");
    expect((await f.exec(ended.id, "cat ~/f")).result).toBe("files\n");
    for (const x of [pausing, resuming, ended]) await f.call("DELETE", `/sandbox/${x.id}`);
  });
});

describe("restart", () => {
  it("a paused sandbox stays paused across a restart of the server, and the next call resumes it", async () => {
    const first = await sandboxFixture(clock);
    const s = await first.create({ autoStopInterval: 0 });
    await first.exec(s.id, "echo survived > ~/f");
    expect((await first.call("POST", `/sandbox/${s.id}/pause`)).body.state).toBe("paused");
    const dataDir = first.t.dataDir;
    await first.stop({ keepData: true });
    const second = await sandboxFixture(clock, { dataDir, adminKey: first.t.adminKey });
    try {
      expect((await second.call("GET", `/sandbox/${s.id}`)).body.state).toBe("paused");
      expect(await second.runtime.provider.cgroups.frozen(s.id)).toBe(true);
      expect((await second.exec(s.id, "cat ~/f")).result).toBe("survived\n");
      expect((await second.call("GET", `/sandbox/${s.id}`)).body.state).toBe("started");
      expect((await second.call("DELETE", `/sandbox/${s.id}`)).status).toBe(200);
    } finally {
      for (const x of await second.runtime.list()) await second.runtime.destroy(x.id);
      await second.stop();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
