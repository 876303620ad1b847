import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { UntypedJson } from "../../packages/control/src/casts.ts";
import { load, runLabel, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's `sandbox.createSnapshot(name)` and `sandbox.fork({name})` on real sandboxes: the
// snapshot of a running sandbox boots a new sandbox with its files, the fork is a started
// copy-on-write clone, and the parent runs on; the refusals the client surfaces.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let daytona: import("sdk-0218").Daytona;
const label = runLabel();

beforeAll(async () => {
  s = await startRealServer();
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
}, 600_000);
afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
});

const get = async (path: string): Promise<UntypedJson> => (await fetch(`${s.apiUrl}${path}`, { headers: { authorization: `Bearer ${s.adminKey}` } })).json();

describe("SDK 0.218.0 createSnapshot and fork", () => {
  it("createSnapshot(name) then create({snapshot: name}); fork({name}); the parent runs on", async () => {
    const sandbox = await daytona.create({ labels: { suite: label } }, { timeout: 120 });
    await sandbox.fs.uploadFile(Buffer.from("checkpoint\n"), "notes.txt");
    await sandbox.process.executeCommand("mkdir -p ~/.local/lib/python3.11/site-packages/widget && echo 'ANSWER = 42' > ~/.local/lib/python3.11/site-packages/widget/__init__.py");

    await sandbox.createSnapshot("sdk-checkpoint");
    expect(sandbox.state).toBe("started");
    const snap = await daytona.snapshot.get("sdk-checkpoint");
    expect(snap.state).toBe("active");
    const child = await daytona.create({ snapshot: "sdk-checkpoint", labels: { suite: label } }, { timeout: 120 });
    expect((await child.process.executeCommand("cat notes.txt; python3 -c 'import widget; print(widget.ANSWER)'")).result).toBe("checkpoint\n42\n");
    await expect(sandbox.createSnapshot("sdk-checkpoint")).rejects.toThrow(/already exists/);

    const fork = await sandbox.fork({ name: "sdk-fork" });
    expect(fork).toMatchObject({ name: "sdk-fork", state: "started" });
    expect(fork.id).not.toBe(sandbox.id);
    await fork.process.executeCommand("echo fork > notes.txt");
    expect((await sandbox.process.executeCommand("cat notes.txt")).result).toBe("checkpoint\n");
    expect((await fork.process.executeCommand("cat notes.txt")).result).toBe("fork\n");
    // Its lineage, on the generated client's paths.
    expect((await get(`/sandbox/${sandbox.id}/forks`)).map((d: { id: string }) => d.id)).toEqual([fork.id]);
    expect((await get(`/sandbox/${fork.id}/parent`)).id).toBe(sandbox.id);
    expect((await get(`/sandbox/${fork.id}/ancestors`)).map((d: { id: string }) => d.id)).toEqual([sandbox.id]);

    await sandbox.stop();
    const stoppedFork = await sandbox.fork();
    expect(stoppedFork.state).toBe("started"); // the client waits for `started`: a stopped parent's fork starts
    for (const x of [child, fork, stoppedFork, sandbox]) await x.delete();
  }, 300_000);
});
