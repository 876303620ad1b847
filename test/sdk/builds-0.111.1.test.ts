import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../packages/runner/src/images/testing/registry.ts";
import { pushTestImage } from "../../packages/control/src/snapshots/testing/image.ts";
import { load, saveRegistry, startRealServer, type RealServer } from "./support.ts";

// SDK 0.111.1's declarative builds (it reads build logs at /snapshots/{id}/build-logs and
// /sandbox/{id}/build-logs directly, and gives its S3 client no region): `Image` with a local
// file uploaded to the embedded object store, `snapshot.create` with onLogs and
// `create({image})` with onSnapshotCreateLogs, against a real server, buildah and a loopback
// registry with basic auth.

type Sdk = typeof import("sdk-0111");
const sdk = load<Sdk>("sdk-0111");

let s: RealServer;
let reg: TestRegistry;
let scratch: string;
let base: string;
let daytona: import("sdk-0111").Daytona;

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "sandbar-sdk111-build-"));
  reg = await startRegistry();
  base = await pushTestImage(reg, scratch, "sdk/base:1.1");
  s = await startRealServer();
  await saveRegistry(s, reg);
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local" });
}, 600_000);

afterAll(async () => {
  await s?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

it("snapshot.create({name, image}, {onLogs}) builds with the uploaded file; create({snapshot}) boots it", async () => {
  const local = join(scratch, "config.ini");
  await writeFile(local, "[app]\nmode=111\n");
  // This client runs commands as `echo <base64> | base64 -d | sh`: the host's base64 goes in as a context file too.
  const image = sdk.Image.base(base).addLocalFile(local, "/etc/app/config.ini").addLocalFile("/usr/bin/base64", "/bin/base64").runCommands("cat /etc/app/config.ini > /seen.txt");
  const logs: string[] = [];
  const snap = await daytona.snapshot.create({ name: "sdk111-build", image }, { onLogs: (l) => logs.push(l), timeout: 60 });
  expect(snap.state).toBe("active");
  expect(logs.at(-1)).toBe("Created snapshot sdk111-build (active)");
  const sandbox = await daytona.create({ snapshot: "sdk111-build" }, { timeout: 120 });
  expect((await sandbox.process.executeCommand("cat /seen.txt")).result).toBe("[app]\nmode=111\n");
  await sandbox.delete();
}, 300_000);

it("create({image}, {onSnapshotCreateLogs}) builds, follows the log and starts", async () => {
  const image = sdk.Image.base(base).addLocalFile("/usr/bin/base64", "/bin/base64").runCommands("echo from-111 > /made.txt").env({ MADE: "by-build" });
  const logs: string[] = [];
  const sandbox = await daytona.create({ image }, { timeout: 120, onSnapshotCreateLogs: (l) => logs.push(l) });
  expect(sandbox.state).toBe("started");
  expect(logs.join("\n")).toContain("RUN echo from-111 > /made.txt");
  expect((await sandbox.process.executeCommand('cat /made.txt; echo "$MADE"')).result).toBe("from-111\nby-build\n");
  await sandbox.delete();
}, 300_000);
