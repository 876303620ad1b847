import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../packages/runner/src/images/testing/registry.ts";
import { pushTestImage } from "../../packages/control/src/snapshots/testing/image.ts";
import { load, saveRegistry, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's snapshot flow against a real server and a real registry on loopback:
// `daytona.snapshot.create({name, image}, {onLogs})` (POST /snapshots, then GET /snapshots/{name}
// every second until active), `daytona.create({snapshot})` booting a real sandbox from the image,
// `snapshot.get/list/delete`.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let reg: TestRegistry;
let scratch: string;
let image: string;
let daytona: import("sdk-0218").Daytona;

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "sandbar-sdk218-snap-"));
  reg = await startRegistry();
  image = await pushTestImage(reg, scratch, "sdk/app:2.0");
  s = await startRealServer();
  await saveRegistry(s, reg);
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local", useDeprecatedPolling: true });
}, 600_000);

afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

it("snapshot.create({name, image}, {onLogs}) waits for active; create({snapshot}) boots from the image", async () => {
  const logs: string[] = [];
  const snap = await daytona.snapshot.create({ name: "sdk-snap", image }, { onLogs: (l) => logs.push(l), timeout: 60 });
  expect(snap).toMatchObject({ name: "sdk-snap", state: "active", imageName: image });
  expect(logs[0]).toMatch(/^Creating snapshot sdk-snap \((pending|pulling)\)$/);
  expect(logs.at(-1)).toBe("Created snapshot sdk-snap (active)");

  expect((await daytona.snapshot.get("sdk-snap")).id).toBe(snap.id);
  const listed = await daytona.snapshot.list();
  expect(listed.items.map((i) => i.name)).toEqual(expect.arrayContaining(["sdk-snap", "sandbar-default"]));

  const sandbox = await daytona.create({ snapshot: "sdk-snap", envVars: { APP_MODE: "sdk" } }, { timeout: 120 });
  expect(sandbox.state).toBe("started");
  expect(sandbox.snapshot).toBe("sdk-snap");
  const r = await sandbox.process.executeCommand('cat /app/hello.txt; echo "$GREETING|$APP_MODE"');
  expect(r.exitCode).toBe(0);
  expect(r.result).toBe("hello from the image\nhello world|sdk\n");
  expect(await sandbox.getWorkDir()).toBe("/app"); // the image's WORKDIR
  await sandbox.delete();

  await daytona.snapshot.delete(snap);
  await expect(daytona.snapshot.get("sdk-snap")).rejects.toThrow(/not found/);
}, 300_000);

it("an image that does not exist fails snapshot.create with the reason", async () => {
  await expect(daytona.snapshot.create({ name: "sdk-missing", image: `${reg.host}/sdk/none:1.0` }, { timeout: 60 })).rejects.toThrow(/Failed to create snapshot\. Name: sdk-missing Reason: .+/);
}, 120_000);
