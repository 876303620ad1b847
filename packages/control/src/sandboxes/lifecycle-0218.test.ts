import { execFile } from "node:child_process";
import { createHash, createHmac, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";

// The 0.218 client's smaller lifecycle routes against real sandboxes running the real agent:
// setTtl (across a restart), recover, last-activity, updateEnv, and signed file URLs used by curl.
// The timers' clock is scaled: a "minute" is 400 ms, a pass every 100 ms.

const MINUTE = 400;
const clock = { timerMinuteMs: MINUTE, timerTickMs: 100 };
const run = promisify(execFile);

let bundle: string;
let f: SandboxFixture;
let scratch: string;
beforeAll(async () => {
  bundle = await buildAgentBundle();
  f = await sandboxFixture({ ...clock, agentBundle: bundle });
  scratch = await mkdtemp(path.join(tmpdir(), "sandbar-0218-"));
});
afterAll(async () => {
  await f?.stop();
  await rm(bundle, { recursive: true, force: true });
  await rm(scratch, { recursive: true, force: true });
});

/** Never stopped by the scaled auto-stop unless a test asks. */
const create = (body: Record<string, unknown> = {}) => f.create({ autoStopInterval: 0, ...body });
const stateOf = async (id: string, fx = f) => {
  const res = await fx.call("GET", `/sandbox/${id}`);
  return res.status === 404 ? "gone" : (res.body.state as string);
};
const execute = async (id: string, command: string) => {
  const res = await f.call("POST", `/toolbox-proxy/${id}/process/execute`, { command });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.result as string;
};

describe("setTtl", () => {
  it("sets autoDestroyAt from now, 0 clears it, negative is refused", async () => {
    const s = await create();
    expect(s.autoDestroyAt).toBeNull();
    const bad = await f.call("POST", `/sandbox/${s.id}/ttl/-1`);
    expect(bad.status).toBe(400);
    expect(bad.body.message).toBe("ttlMinutes must be a non-negative integer");
    const before = Date.now();
    const set = await f.call("POST", `/sandbox/${s.id}/ttl/1000`);
    expect(set.status, JSON.stringify(set.body)).toBe(200);
    const at = Date.parse(set.body.autoDestroyAt);
    expect(at).toBeGreaterThanOrEqual(before + 1000 * MINUTE);
    expect(at).toBeLessThanOrEqual(Date.now() + 1000 * MINUTE);
    expect((await f.call("GET", `/sandbox/${s.id}`)).body.autoDestroyAt).toBe(set.body.autoDestroyAt);
    const cleared = await f.call("POST", `/sandbox/${s.id}/ttl/0`);
    expect(cleared.body.autoDestroyAt).toBeNull();
    expect((await f.call("POST", `/sandbox/${s.id}/ttl/1`, undefined, (await f.otherOrganization()).key)).status).toBe(404);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });

  it("deletes a stopped sandbox at its time too, whatever its state", async () => {
    const s = await create();
    expect((await f.call("POST", `/sandbox/${s.id}/stop`)).status).toBe(200);
    const at = Date.parse((await f.call("POST", `/sandbox/${s.id}/ttl/2`)).body.autoDestroyAt);
    await eventually("the TTL to delete the stopped sandbox", async () => ["destroyed", "gone"].includes(await stateOf(s.id)), 15_000);
    expect(Date.now()).toBeGreaterThanOrEqual(at);
    await expect(f.runtime.provider.inspect(s.id)).rejects.toThrow();
  });

  it("deletes on time across a restart of the server: the time is in the database", async () => {
    const first = await sandboxFixture({ ...clock, agentBundle: bundle });
    const s = await first.create({ autoStopInterval: 0 });
    // Long enough that the first server is gone before it falls due.
    const at = Date.parse((await first.call("POST", `/sandbox/${s.id}/ttl/15`)).body.autoDestroyAt);
    const dataDir = first.t.dataDir;
    await first.stop({ keepData: true });
    const second = await sandboxFixture({ ...clock, agentBundle: bundle }, { dataDir, adminKey: first.t.adminKey });
    try {
      expect(await stateOf(s.id, second)).not.toBe("gone");
      await eventually("the restarted server's timers to delete it", async () => ["destroyed", "gone"].includes(await stateOf(s.id, second)), 30_000);
      expect(Date.now()).toBeGreaterThanOrEqual(at);
      expect((await second.runtime.list()).map((x) => x.id)).not.toContain(s.id);
    } finally {
      for (const x of await second.runtime.list()) await second.runtime.destroy(x.id);
      await second.stop();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

/** Kills the sandbox's first process from the host, as an OOM kill or a crash would, and lets the timers' check mark it. */
async function killInit(id: string): Promise<void> {
  const p = f.runtime.provider;
  for (const pid of await p.cgroups.agentPids(id)) {
    const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
    const ns = /^NSpid:\s+(.*)$/m.exec(status)?.[1].trim().split(/\s+/) ?? [];
    if (ns.length > 1 && ns[ns.length - 1] === "1") process.kill(pid, "SIGKILL");
  }
  await eventually("the sandbox's first process is gone", async () => (await p.inspect(id)).state === "error");
  // What the timers do (they may be at it already: then theirs marks it).
  await f.manager.markLost(id, "the sandbox is gone from its host");
  await eventually("the sandbox to be marked errored", async () => (await stateOf(id)) === "error");
}

describe("recover", () => {
  it("brings back a sandbox whose first process died, with its files; refuses one that is not errored", async () => {
    const s = await create();
    const notErrored = await f.call("POST", `/sandbox/${s.id}/recover`);
    expect(notErrored.status).toBe(400);
    expect(notErrored.body.message).toBe("Sandbox is not in an errored state (it is started): there is nothing to recover");
    await execute(s.id, "echo kept > ~/kept");
    await killInit(s.id);
    const errored = (await f.call("GET", `/sandbox/${s.id}`)).body;
    expect(errored).toMatchObject({ state: "error", recoverable: true });
    expect((await f.call("GET", `/sandbox?isRecoverable=true&limit=200`)).body.items.map((x: { id: string }) => x.id)).toContain(s.id);
    const back = await f.call("POST", `/sandbox/${s.id}/recover`);
    expect(back.status, JSON.stringify(back.body)).toBe(200);
    expect(back.body).toMatchObject({ state: "started", errorReason: null });
    expect(back.body.recoverable).toBe(false);
    expect(await execute(s.id, "cat ~/kept")).toBe("kept\n");

    // skipStart: left stopped, and starts later as any stopped sandbox.
    await killInit(s.id);
    const skipped = await f.call("POST", `/sandbox/${s.id}/recover?skipStart=true`);
    expect(skipped.status, JSON.stringify(skipped.body)).toBe(200);
    await eventually("stopped", async () => (await stateOf(s.id)) === "stopped");
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect(await execute(s.id, "cat ~/kept")).toBe("kept\n");
    await f.call("DELETE", `/sandbox/${s.id}`);
  });

  it("refuses an error that lost the sandbox's files, saying why", async () => {
    const s = await create();
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await f.runtime.destroy(s.id);
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).status).toBe(400);
    expect((await f.call("GET", `/sandbox/${s.id}`)).body).toMatchObject({ state: "error", recoverable: false });
    const res = await f.call("POST", `/sandbox/${s.id}/recover`);
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/^Sandbox error is not recoverable: Sandbox has no runner and backup is not completed/);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });
});

describe("last-activity", () => {
  it("stamps activity now, so auto-stop counts from it", async () => {
    const s = await create({ autoStopInterval: 3 });
    const before = Date.parse((await f.call("GET", `/sandbox/${s.id}`)).body.lastActivityAt);
    // Kept alive by refreshActivity alone, pass after pass of the timers, until a pass has run twice
    // its interval after the last activity before the refreshes (it would have stopped it by then).
    const timers = f.t.server.sandboxes.timers;
    const pass = timers.tick.bind(timers);
    let lastPass = 0; // the clock of the latest pass that finished
    const spy = vi.spyOn(timers, "tick").mockImplementation(async (now = Date.now()) => {
      await pass(now);
      lastPass = Math.max(lastPass, now);
    });
    let last = before;
    try {
      while (lastPass < before + 2 * 3 * MINUTE) {
        const res = await f.call("POST", `/sandbox/${s.id}/last-activity`, { activityType: "test" });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        last = Date.parse((await f.call("GET", `/sandbox/${s.id}`)).body.lastActivityAt);
        const refreshed = Date.now();
        await eventually("a timer pass after the refresh", async () => lastPass > refreshed, 10_000);
        expect(await stateOf(s.id)).toBe("started");
      }
    } finally {
      spy.mockRestore();
    }
    expect(last).toBeGreaterThan(before);
    expect((await f.call("POST", `/sandbox/${s.id}/last-activity`, {}, (await f.otherOrganization()).key)).status).toBe(404);
    // Left alone, it stops.
    await eventually("the sandbox to stop once idle", async () => (await stateOf(s.id)) === "stopped", 15_000);
    await f.call("DELETE", `/sandbox/${s.id}`);
  });
});

describe("updateEnv", () => {
  it("changes the env of new processes and sessions now and of later starts; validates names", async () => {
    const s = await create({ env: { PROJECT: "sandbar", GONE: "x" } });
    const res = await f.call("POST", `/toolbox-proxy/${s.id}/env`, { set: { ADDED: "a b", PROJECT: "changed" }, unset: ["GONE"] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // The agent answers the environment its new processes get.
    expect(res.body).toMatchObject({ PROJECT: "changed", ADDED: "a b" });
    expect(res.body.GONE).toBeUndefined();
    const probe = 'echo "$PROJECT|$ADDED|${GONE-unset}"';
    expect(await execute(s.id, probe)).toBe("changed|a b|unset\n");
    const sid = `env-${randomBytes(4).toString("hex")}`;
    expect((await f.call("POST", `/toolbox-proxy/${s.id}/process/session`, { sessionId: sid })).status).toBeLessThan(300);
    const inSession = await f.call("POST", `/toolbox-proxy/${s.id}/process/session/${sid}/exec`, { command: probe });
    expect(inSession.status, JSON.stringify(inSession.body)).toBe(200);
    expect(inSession.body.output).toContain("changed|a b|unset");
    expect((await f.call("GET", `/sandbox/${s.id}`)).body.env).toEqual({ PROJECT: "changed", ADDED: "a b" });

    await f.call("POST", `/sandbox/${s.id}/stop`);
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect(await execute(s.id, probe)).toBe("changed|a b|unset\n");

    const badName = await f.call("POST", `/toolbox-proxy/${s.id}/env`, { set: { "1BAD": "x" }, unset: ["A-B"] });
    expect(badName.status).toBe(400);
    expect(badName.body.message).toContain('env name "1BAD" is invalid');
    expect(badName.body.message).toContain('env name "A-B" is invalid');
    const tooBig = await f.call("POST", `/toolbox-proxy/${s.id}/env`, { set: { BIG: "x".repeat(65 * 1024) } });
    expect(tooBig.status).toBe(400);
    await f.call("POST", `/sandbox/${s.id}/stop`);
    const stopped = await f.call("POST", `/toolbox-proxy/${s.id}/env`, { set: { A: "1" } });
    expect(stopped.status).toBe(400);
    expect(stopped.body.message).toBe("Sandbox is not running");
    await f.call("DELETE", `/sandbox/${s.id}`);
  });
});

describe("signed file URLs", () => {
  const sign = (key: string, method: string, p: string, expires: number) => `v1_${createHmac("sha256", key).update(`v1:files:${method}:${p}:${expires}`).digest("base64url")}`;
  const urlOf = (id: string, op: string, p: string, expires: number, signature: string) =>
    `${f.t.url}/api/toolbox-proxy/${id}${op}?${new URLSearchParams({ path: p, expires: String(expires), signature })}`;
  const curl = async (...args: string[]) => {
    const { stdout } = await run("curl", ["-sS", "-o", path.join(scratch, "body"), "-w", "%{http_code}", ...args]);
    return { status: Number(stdout), body: await readFile(path.join(scratch, "body"), "utf8").catch(() => "") };
  };

  it("open one path with one method without an API key; expired, altered, other-path, other-method and rotated URLs are refused", async () => {
    const s = await create();
    const other = await create();
    const keyRes = await f.call("GET", `/sandbox/${s.id}/signing-key`);
    expect(keyRes.status).toBe(200);
    const key = keyRes.body as string;
    expect(typeof key).toBe("string");
    expect((await f.call("GET", `/sandbox/${s.id}/signing-key`)).body).toBe(key); // made once
    const soon = Math.floor(Date.now() / 1000) + 3600;
    const target = "/home/sandbar/data.bin";

    // Upload with curl's multipart, 24 MiB, streamed through.
    const local = path.join(scratch, "data.bin");
    const data = randomBytes(24 * 1024 * 1024);
    await writeFile(local, data);
    const up = await curl("-X", "POST", "-F", `file=@${local}`, urlOf(s.id, "/files/upload-v2", target, soon, sign(key, "POST", target, soon)));
    expect(up.status, up.body).toBe(200);
    expect(JSON.parse(up.body)).toEqual({ name: "data.bin", path: target, type: "file" });
    expect(await execute(s.id, `sha256sum ${target} | cut -d' ' -f1`)).toBe(createHash("sha256").update(data).digest("hex") + "\n");

    // Download with curl; expires=0 never expires.
    const down = path.join(scratch, "down.bin");
    const { stdout } = await run("curl", ["-sS", "-o", down, "-w", "%{http_code}", urlOf(s.id, "/files/download", target, 0, sign(key, "GET", target, 0))]);
    expect(stdout).toBe("200");
    expect(createHash("sha256").update(await readFile(down)).digest("hex")).toBe(createHash("sha256").update(data).digest("hex"));

    const past = Math.floor(Date.now() / 1000) - 5;
    const expired = await curl(urlOf(s.id, "/files/download", target, past, sign(key, "GET", target, past)));
    expect(expired.status).toBe(403);
    expect(JSON.parse(expired.body).message).toMatch(/^The signed URL expired at /);

    const good = sign(key, "GET", target, soon);
    const altered = await curl(urlOf(s.id, "/files/download", target, soon, good.slice(0, -2) + (good.endsWith("AA") ? "BB" : "AA")));
    expect(altered.status).toBe(401);
    expect(JSON.parse(altered.body).message).toMatch(/^Invalid signed URL: the signature does not match/);
    expect((await curl(urlOf(s.id, "/files/download", "/etc/passwd", soon, good))).status).toBe(401);
    expect((await curl(urlOf(s.id, "/files/download", target, soon + 60, good))).status).toBe(401);
    // A download URL does not upload, nor open another sandbox.
    expect((await curl("-X", "POST", "-F", `file=@${local}`, urlOf(s.id, "/files/upload-v2", target, soon, good))).status).toBe(401);
    expect((await curl(urlOf(other.id, "/files/download", target, soon, good))).status).toBe(401);
    // Nor any other toolbox route.
    expect((await curl(`${f.t.url}/api/toolbox-proxy/${s.id}/files?${new URLSearchParams({ path: target, expires: String(soon), signature: good })}`)).status).toBe(401);
    expect((await curl(urlOf(s.id, "/files/download", target, soon, good))).status).toBe(200);

    // Rotation: every URL signed before is refused; the new key signs good ones.
    const rotated = await f.call("POST", `/sandbox/${s.id}/signing-key/rotate`);
    expect(rotated.status).toBe(200);
    expect(rotated.body).not.toBe(key);
    expect((await curl(urlOf(s.id, "/files/download", target, soon, good))).status).toBe(401);
    expect((await curl(urlOf(s.id, "/files/download", target, soon, sign(rotated.body, "GET", target, soon)))).status).toBe(200);
    // Another organization cannot read the key.
    expect((await f.call("GET", `/sandbox/${s.id}/signing-key`, undefined, (await f.otherOrganization()).key)).status).toBe(404);
    // The key is stored sealed, never in clear.
    const [row] = (await f.t.server.orm.em.getConnection().execute(`select signing_key_sealed from sandbox where id = ?`, [s.id])) as Array<{ signing_key_sealed: string }>;
    expect(row!.signing_key_sealed.startsWith("v1:")).toBe(true);
    expect(row!.signing_key_sealed).not.toContain(rotated.body);
    await f.call("DELETE", `/sandbox/${s.id}`);
    await f.call("DELETE", `/sandbox/${other.id}`);
  });
});
