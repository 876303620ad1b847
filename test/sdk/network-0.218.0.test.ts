import { type FakeInternet, fakeInternet } from "@sandbar/runner/testing/fake-internet";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { load, startRealServer, type RealServer } from "./support.ts";

// The official client's network options (SDK 0.218.0): create with networkAllowList and
// networkBlockAll, sandbox.updateNetworkSettings on a running sandbox, and what the sandbox then
// reaches. "The internet" is a namespace the test makes; no traffic leaves the machine.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let net: FakeInternet;
let daytona: import("sdk-0218").Daytona;

/** HTTP GET with the sandbox's python: the body, or "fail". */
async function get(sandbox: import("sdk-0218").Sandbox, host: string): Promise<string> {
  const code = `import urllib.request\ntry:\n    print(urllib.request.urlopen("http://${host}:${net.port}/", timeout=1.5).read().decode())\nexcept Exception as e:\n    print("fail", type(e).__name__)`;
  const r = await sandbox.process.codeRun(code);
  return r.result.trim();
}

beforeAll(async () => {
  net = await fakeInternet(8080);
  s = await startRealServer();
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
}, 600_000);

afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
  await net?.close();
});

describe("SDK 0.218.0 network options", () => {
  it("create with networkAllowList, then updateNetworkSettings without a restart", async () => {
    const sandbox = await daytona.create({ language: "python", networkAllowList: `${net.inet}/32` }, { timeout: 120 });
    expect(sandbox.networkAllowList).toBe(`${net.inet}/32`);
    expect(sandbox.networkBlockAll).toBe(false);
    expect(await get(sandbox, net.inet)).toBe(`inet ${net.inet}`);
    expect(await get(sandbox, net.far)).toMatch(/^fail/);

    await sandbox.updateNetworkSettings({ networkAllowList: `${net.far}/32` });
    expect(sandbox.networkAllowList).toBe(`${net.far}/32`);
    expect(await get(sandbox, net.far)).toBe(`inet ${net.far}`);
    expect(await get(sandbox, net.inet)).toMatch(/^fail/);

    await sandbox.updateNetworkSettings({ networkBlockAll: true });
    expect(sandbox.networkBlockAll).toBe(true);
    expect(await get(sandbox, net.far)).toMatch(/^fail/);

    await expect(sandbox.updateNetworkSettings({ networkAllowList: "10.0.0.0" })).rejects.toThrow(/Missing CIDR prefix length/);
    await expect(daytona.create({ networkAllowList: Array.from({ length: 11 }, (_, i) => `10.${i}.0.0/16`).join(",") })).rejects.toThrow(
      /Network allow list cannot contain more than 10 networks/,
    );
    await sandbox.delete();
  });

  it("create with networkBlockAll reaches nothing", async () => {
    const sandbox = await daytona.create({ language: "python", networkBlockAll: true }, { timeout: 120 });
    expect(sandbox.networkBlockAll).toBe(true);
    expect(await get(sandbox, net.inet)).toMatch(/^fail/);
    await sandbox.delete();
  });
});
