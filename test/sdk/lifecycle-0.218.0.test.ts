import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";
import { LocalRuntime } from "../../packages/control/src/sandboxes/local-runtime.ts";
import { load, runLabel, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's smaller lifecycle methods on real sandboxes: setTtl (the sandbox goes at its
// time), recover (of a sandbox whose first process was killed), refreshActivity, updateEnv, and
// downloadUrl/uploadUrl used with plain fetch, invalidated by rotateSigningKey. The timers'
// minute is scaled to 1 s so a TTL of 2 minutes falls due within the test.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");
const MINUTE = 1000;

let s: RealServer;
let daytona: import("sdk-0218").Daytona;
const label = runLabel();

beforeAll(async () => {
  s = await startRealServer(undefined, { timerMinuteMs: MINUTE, timerTickMs: 200 });
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
}, 600_000);
afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
});

const newSandbox = () => daytona.create({ labels: { suite: label }, autoStopInterval: 0 }, { timeout: 120 });

/** What an OOM kill or a crash does: the sandbox's first process is killed from the host; the timers' check marks it. */
async function killFirstProcess(id: string): Promise<void> {
  const { runtime, manager } = s.server.server.sandboxes;
  if (!(runtime instanceof LocalRuntime)) throw new Error("the local runtime is needed");
  for (const pid of await runtime.provider.cgroups.agentPids(id)) {
    const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
    const ns = /^NSpid:\s+(.*)$/m.exec(status)?.[1].trim().split(/\s+/) ?? [];
    if (ns.length > 1 && ns[ns.length - 1] === "1") process.kill(pid, "SIGKILL");
  }
  await eventually("the first process to be gone", async () => (await runtime.provider.inspect(id)).state === "error");
  // What the timers do (they may be at it already: then theirs marks it).
  await manager.markLost(id, "the sandbox is gone from its host");
  await eventually("the sandbox to be marked errored", async () => (await manager.store.byId(id))?.state === "error");
}

describe("SDK 0.218.0 lifecycle", () => {
  it("setTtl: autoDestroyAt is set and cleared, and the sandbox is deleted at its time", async () => {
    const sandbox = await newSandbox();
    await expect(sandbox.setTtl(-1)).rejects.toThrow("ttlMinutes must be a non-negative integer");
    await sandbox.setTtl(600);
    await sandbox.refreshData();
    expect(Date.parse(sandbox.autoDestroyAt!)).toBeGreaterThan(Date.now());
    await sandbox.setTtl(0);
    await sandbox.refreshData();
    expect(sandbox.autoDestroyAt).toBeFalsy();
    await sandbox.setTtl(2);
    await sandbox.refreshData();
    const at = Date.parse(sandbox.autoDestroyAt!);
    await eventually(
      "the TTL to delete the sandbox",
      async () => {
        try {
          await sandbox.refreshData();
          return sandbox.state === "destroyed";
        } catch (err) {
          return /not found/i.test(String(err));
        }
      },
      30_000,
    );
    expect(Date.now()).toBeGreaterThanOrEqual(at);
  });

  it("recover: a sandbox whose first process died is recoverable and comes back with its files", async () => {
    const sandbox = await newSandbox();
    await expect(sandbox.recover()).rejects.toThrow(/Sandbox is not in an errored state/);
    await sandbox.process.executeCommand("echo kept > ~/kept");
    await killFirstProcess(sandbox.id);
    await sandbox.refreshData();
    expect(sandbox.state).toBe("error");
    expect(sandbox.recoverable).toBe(true);
    await sandbox.recover();
    expect(sandbox.state).toBe("started");
    expect((await sandbox.process.executeCommand("cat ~/kept")).result.trim()).toBe("kept");
    await daytona.delete(sandbox);
  });

  it("refreshActivity moves lastActivityAt; updateEnv reaches new processes and later starts", async () => {
    const sandbox = await daytona.create({ labels: { suite: label }, autoStopInterval: 0, envVars: { KEEP: "1", DROP: "2" } }, { timeout: 120 });
    const before = Date.parse(sandbox.lastActivityAt!);
    await eventually("a later millisecond", async () => Date.now() > before + 5);
    await sandbox.refreshActivity();
    await sandbox.refreshData();
    expect(Date.parse(sandbox.lastActivityAt!)).toBeGreaterThan(before);

    await sandbox.updateEnv({ ADDED: "yes" }, { unset: ["DROP"] });
    const probe = 'echo "$KEEP|$ADDED|${DROP-unset}"';
    expect((await sandbox.process.executeCommand(probe)).result.trim()).toBe("1|yes|unset");
    await sandbox.refreshData();
    expect(sandbox.env).toEqual({ KEEP: "1", ADDED: "yes" });
    await sandbox.stop();
    await sandbox.start();
    expect((await sandbox.process.executeCommand(probe)).result.trim()).toBe("1|yes|unset");
    await expect(sandbox.updateEnv({ "BAD-NAME": "x" })).rejects.toThrow(/env name "BAD-NAME" is invalid/);
    await daytona.delete(sandbox);
  });

  it("downloadUrl and uploadUrl work with plain fetch, no API key; rotateSigningKey invalidates them", async () => {
    const sandbox = await newSandbox();
    const content = `signed ${label}\n`;
    const upload = await sandbox.uploadUrl("/home/sandbar/up.txt", 300);
    const form = new FormData();
    form.append("file", new Blob([content]), "up.txt");
    const up = await fetch(upload, { method: "POST", body: form });
    expect(up.status, await up.clone().text()).toBe(200);
    expect((await sandbox.process.executeCommand("cat ~/up.txt")).result.trim()).toBe(content.trim());

    const download = await sandbox.downloadUrl("/home/sandbar/up.txt");
    const got = await fetch(download);
    expect(got.status).toBe(200);
    expect(await got.text()).toBe(content);
    // ttlSeconds <= 0: never expires.
    const forever = await sandbox.downloadUrl("/home/sandbar/up.txt", 0);
    expect(new URL(forever).searchParams.get("expires")).toBe("0");
    expect((await fetch(forever)).status).toBe(200);
    // Another path than signed.
    const other = new URL(download);
    other.searchParams.set("path", "/etc/shadow");
    expect((await fetch(other)).status).toBe(401);

    await sandbox.rotateSigningKey();
    const refused = await fetch(download);
    expect(refused.status).toBe(401);
    expect(await refused.text()).toMatch(/signing key was rotated/);
    expect((await fetch(forever)).status).toBe(401);
    const fresh = await fetch(await sandbox.downloadUrl("/home/sandbar/up.txt"));
    expect(fresh.status).toBe(200);
    expect(await fresh.text()).toBe(content);
    await daytona.delete(sandbox);
  });
});
