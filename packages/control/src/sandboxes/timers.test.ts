import { rm, stat } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually, sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";
import { leftovers } from "./testing/leaks.ts";

// Auto-stop, auto-archive and auto-delete with the timer clock scaled: one "minute" is 400 ms
// and the timers run every 100 ms.

const MINUTE = 400;
const clock = { timerMinuteMs: MINUTE, timerTickMs: 100 };

let f: SandboxFixture;
beforeAll(async () => {
  f = await sandboxFixture(clock);
});
afterAll(() => f?.stop());

const stateOf = async (id: string) => {
  const res = await f.call("GET", `/sandbox/${id}`);
  return res.status === 404 ? "gone" : (res.body.state as string);
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("auto-stop", () => {
  it("stops a sandbox idle for its interval, and activity keeps it running", async () => {
    const busy = await f.create({ autoStopInterval: 2 });
    const t0 = Date.now();
    // `busy` is used all along (the toolbox stamps activity through touch()).
    const keepBusy = (async () => {
      while (Date.now() - t0 < 6 * MINUTE) {
        f.manager.touch(busy.id);
        await sleep(50);
      }
    })();
    const idle = await f.create({ autoStopInterval: 1 });
    await eventually("the idle sandbox to stop", async () => (await stateOf(idle.id)) === "stopped", 10_000);
    expect(Date.now() - Date.parse(idle.lastActivityAt)).toBeGreaterThanOrEqual(MINUTE);
    await keepBusy;
    expect(await stateOf(busy.id)).toBe("started");
    // Left alone, it stops after its two minutes.
    const t1 = Date.now();
    await eventually("the busy sandbox to stop once idle", async () => (await stateOf(busy.id)) === "stopped", 10_000);
    expect(Date.now() - t1).toBeGreaterThanOrEqual(2 * MINUTE - 250);
  });

  it("never stops a sandbox whose interval is 0", async () => {
    const s = await f.create({ autoStopInterval: 0 });
    await sleep(5 * MINUTE);
    expect(await stateOf(s.id)).toBe("started");
    await f.call("POST", `/sandbox/${s.id}/autostop/1`);
    await eventually("the sandbox to stop once the interval is set", async () => (await stateOf(s.id)) === "stopped", 10_000);
  });

  it("destroys an ephemeral sandbox when auto-stop fires", async () => {
    const s = await f.create({ autoStopInterval: 1, autoDeleteInterval: 0 });
    const { hostUid } = await f.runtime.provider.inspect(s.id);
    await eventually("the ephemeral sandbox to go", async () => (await stateOf(s.id)) === "gone", 10_000);
    expect(await leftovers(f.runtime, s.id, hostUid)).toEqual([]);
  });
});

describe("auto-archive and auto-delete", () => {
  it("archives a sandbox stopped for its interval", async () => {
    const s = await f.create({ autoStopInterval: 0, autoArchiveInterval: 1 });
    await f.exec(s.id, "echo archived-by-timer > ~/f");
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await eventually("the sandbox to be archived", async () => (await stateOf(s.id)) === "archived", 10_000);
    await stat(path.join(f.t.dataDir, "archives", `${s.id}.tar`));
    expect(await f.runtime.inspect(s.id)).toBeUndefined();
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await f.exec(s.id, "cat ~/f")).result).toBe("archived-by-timer\n");
  });

  it("deletes a sandbox stopped for its auto-delete interval, and an archived one too", async () => {
    const stopped = await f.create({ autoStopInterval: 0, autoDeleteInterval: 2 });
    const archived = await f.create({ autoStopInterval: 0, autoArchiveInterval: 1, autoDeleteInterval: 4 });
    const { hostUid } = await f.runtime.provider.inspect(stopped.id);
    await f.call("POST", `/sandbox/${stopped.id}/stop`);
    await f.call("POST", `/sandbox/${archived.id}/stop`);
    await eventually("the second sandbox to be archived", async () => (await stateOf(archived.id)) === "archived", 10_000);
    await eventually("the stopped sandbox to be deleted", async () => (await stateOf(stopped.id)) === "gone", 10_000);
    expect(await leftovers(f.runtime, stopped.id, hostUid)).toEqual([]);
    await eventually("the archived sandbox to be deleted", async () => (await stateOf(archived.id)) === "gone", 10_000);
    await expect(stat(path.join(f.t.dataDir, "archives", `${archived.id}.tar`))).rejects.toThrow();
  });
});

describe("health", () => {
  it("reports a started sandbox whose processes died as error, with the reason", async () => {
    const s = await f.create({ autoStopInterval: 0 });
    await f.runtime.provider.cgroups.kill(s.id);
    await eventually("the sandbox to be reported in error", async () => (await stateOf(s.id)) === "error", 10_000);
    const got = (await f.call("GET", `/sandbox/${s.id}`)).body;
    expect(got.errorReason).toMatch(/first process/);
    expect((await f.call("DELETE", `/sandbox/${s.id}`)).body.state).toBe("destroyed");
  });
});

describe("restart", () => {
  it("keeps counting across a restart: the timers live in the database", async () => {
    const first = await sandboxFixture(clock);
    const s = await first.create({ autoStopInterval: 3 });
    const dataDir = first.t.dataDir;
    await first.stop({ keepData: true });
    // The sandbox kept running while no server was up; the next server adopts it and stops it.
    const second = await sandboxFixture(clock, { dataDir, adminKey: first.t.adminKey });
    try {
      await eventually("the adopted sandbox to be stopped by the timer", async () => (await second.call("GET", `/sandbox/${s.id}`)).body.state === "stopped", 15_000);
      expect((await second.call("DELETE", `/sandbox/${s.id}`)).status).toBe(200);
    } finally {
      for (const x of await second.runtime.list()) await second.runtime.destroy(x.id);
      await second.stop();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
