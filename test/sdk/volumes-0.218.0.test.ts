import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { load, runLabel, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's volume flow on real sandboxes: `volume.get(name, true)` (a 404 whose message the
// client matches makes it create the volume), then sandboxes created with `volumes`, sharing it.

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

describe("SDK 0.218.0 volumes", () => {
  it("volume.get(name, true) creates once; sandboxes created with volumes share its files; delete refused while mounted", async () => {
    const volume = await daytona.volume.get(`vol-${label}`, true);
    expect(volume).toMatchObject({ name: `vol-${label}`, state: "ready" });
    expect((await daytona.volume.get(`vol-${label}`, true)).id).toBe(volume.id);
    expect((await daytona.volume.list()).map((v) => v.id)).toContain(volume.id);

    const writer = await daytona.create({ labels: { suite: label }, volumes: [{ volumeId: volume.id, mountPath: "/mnt/shared" }] }, { timeout: 120 });
    expect(writer.volumes).toEqual([expect.objectContaining({ volumeId: volume.id, mountPath: "/mnt/shared" })]);
    expect(await writer.process.executeCommand("echo hello-from-writer > /mnt/shared/note && echo ok")).toMatchObject({ exitCode: 0, result: "ok\n" });
    const reader = await daytona.create({ labels: { suite: label }, volumes: [{ volumeId: volume.id, mountPath: "/srv/data", subpath: "" }] }, { timeout: 120 });
    expect((await reader.process.executeCommand("cat /srv/data/note")).result).toBe("hello-from-writer\n");

    await expect(daytona.volume.delete(volume)).rejects.toThrow(/Volume cannot be deleted because it is in use by one or more sandboxes/);
    await daytona.delete(writer);
    await daytona.delete(reader);
    await daytona.volume.delete(volume);
    expect((await daytona.volume.list()).map((v) => v.id)).not.toContain(volume.id);
    const after = (await (await fetch(`${s.apiUrl}/volumes?includeDeleted=true`, { headers: { authorization: `Bearer ${s.adminKey}` } })).json()) as Array<{ id: string }>;
    expect(after.find((v) => v.id === volume.id)).toMatchObject({ state: "deleted", name: `vol-${label}-deleted` });
  });
});
