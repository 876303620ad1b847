import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { load, runLabel, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's `sandbox.resize` on a real sandbox: hot cpu/memory up (seen by a process
// inside through the memory it may hold), the refusals it documents, and a disk grown while stopped.

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

/** Exit code of a process inside that holds `mib` MiB (137: the OOM killer ended it). */
async function hold(sandbox: import("sdk-0218").Sandbox, mib: number): Promise<string> {
  const js = `const a = []; for (let i = 0; i < ${mib / 16}; i++) a.push(Buffer.alloc(16 << 20, 1)); console.log(a.length)`;
  return (await sandbox.process.executeCommand(`/opt/sandbar/bin/node -e '${js}' >/dev/null 2>&1; echo $?`)).result.trim();
}

describe("SDK 0.218.0 resize", () => {
  it("resizes cpu and memory hot, refuses what the reference refuses, grows the disk when stopped", async () => {
    // The default shape: 1 core, 1 GiB, 3 GiB of disk (the client sends resources only with an image).
    const sandbox = await daytona.create({ labels: { suite: label } }, { timeout: 120 });
    expect(sandbox).toMatchObject({ cpu: 1, memory: 1, disk: 3 });
    expect(await hold(sandbox, 1280)).not.toBe("0");

    await sandbox.resize({ cpu: 2, memory: 2 });
    expect(sandbox).toMatchObject({ state: "started", cpu: 2, memory: 2, disk: 3 });
    expect(await hold(sandbox, 1280)).toBe("0");

    await expect(sandbox.resize({ disk: 4 })).rejects.toThrow("Disk resize can only be performed on a stopped sandbox");
    await expect(sandbox.resize({ memory: 1 })).rejects.toThrow("Sandbox must be in stopped state to decrease memory");
    await expect(sandbox.resize({ cpu: 2 })).rejects.toThrow("No resource changes specified - sandbox is already at the desired configuration");

    await sandbox.stop();
    await sandbox.resize({ cpu: 1, disk: 4 });
    expect(sandbox).toMatchObject({ state: "stopped", cpu: 1, memory: 2, disk: 4 });
    await expect(sandbox.resize({ disk: 3 })).rejects.toThrow("Sandbox disk size cannot be decreased");
    await sandbox.start();
    const df = (await sandbox.process.executeCommand("df -BG / | tail -1")).result.trim().split(/\s+/);
    expect(df[1]).toBe("4G");
    await daytona.delete(sandbox);
  });
});
