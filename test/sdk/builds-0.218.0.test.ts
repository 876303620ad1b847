import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../packages/runner/src/images/testing/registry.ts";
import { pushTestImage } from "../../packages/control/src/snapshots/testing/image.ts";
import { load, startRealServer, type RealServer } from "./support.ts";

// SDK 0.218.0's declarative builds against a real server: the `Image` builder's Dockerfile and
// its local file uploaded as a context through push-access to the embedded object store (s3rver),
// built by buildah FROM an image on a loopback registry with basic auth (credentials saved through
// the registries API), `snapshot.create({name, image}, {onLogs})` following the build logs
// (build-logs-url), and a sandbox booted from the result.

type Sdk = typeof import("sdk-0218");
const sdk = load<Sdk>("sdk-0218");

let s: RealServer;
let reg: TestRegistry;
let scratch: string;
let base: string;
let daytona: import("sdk-0218").Daytona;

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "sandbar-sdk218-build-"));
  reg = await startRegistry();
  base = await pushTestImage(reg, scratch, "sdk/base:1.0");
  s = await startRealServer();
  const saved = await fetch(`${s.apiUrl}/docker-registry`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminKey}`, "content-type": "application/json" },
    body: JSON.stringify({ name: "test registry", url: `http://${reg.host}`, username: reg.username, password: reg.password }),
  });
  expect(saved.status, await saved.clone().text()).toBe(201);
  daytona = new sdk.Daytona({ apiKey: s.adminKey, apiUrl: s.apiUrl, target: "local" });
}, 600_000);

afterAll(async () => {
  await daytona?.[Symbol.asyncDispose]?.();
  await s?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

it("snapshot.create({name, image: Image.base().runCommands().addLocalFile()}, {onLogs}) builds; a sandbox boots from it", async () => {
  const local = join(scratch, "notes.txt");
  await writeFile(local, "from my laptop\n");
  const image = sdk.Image.base(base).runCommands("echo built > /built.txt").addLocalFile(local, "/app/notes.txt").env({ BUILT: "yes" });
  const logs: string[] = [];
  const snap = await daytona.snapshot.create({ name: "sdk-build", image }, { onLogs: (l) => logs.push(l), timeout: 60 });
  expect(snap).toMatchObject({ name: "sdk-build", state: "active" });
  expect(snap.imageName).toMatch(/^daytona-[0-9a-f]{64}:daytona$/);
  expect(snap.buildInfo?.dockerfileContent).toContain(`COPY ${local} /app/notes.txt`);
  expect(snap.buildInfo?.contextHashes).toHaveLength(1);
  const text = logs.join("\n");
  expect(text).toContain("RUN echo built > /built.txt"); // buildah's own output, followed
  expect(logs.at(-1)).toBe("Created snapshot sdk-build (active)");

  const sandbox = await daytona.create({ snapshot: "sdk-build" }, { timeout: 120 });
  const r = await sandbox.process.executeCommand('cat /built.txt /app/notes.txt; echo "$BUILT|$GREETING"');
  expect(r.result).toBe("built\nfrom my laptop\nyes|hello world\n");
  await sandbox.delete();

  // The same Image again: the build is reused (no buildah run), under another name.
  const t0 = Date.now();
  const twin = await daytona.snapshot.create({ name: "sdk-build-2", image }, { timeout: 60 });
  expect(twin.state).toBe("active");
  expect(twin.ref).toBe(snap.ref);
  expect(Date.now() - t0).toBeLessThan(5_000);
  // (Done before the client's first poll, so it followed nothing: the recorded log says why.)
  const recorded = await fetch(`${s.apiUrl}/snapshots/${twin.id}/build-logs`, { headers: { authorization: `Bearer ${s.adminKey}` } });
  expect(await recorded.text()).toMatch(/is cached as sha256:/);
}, 400_000);

it("a failing RUN ends in build_failed with the builder's last lines as the reason", async () => {
  const image = sdk.Image.base(base).runCommands("echo going down >&2; exit 3");
  const err = await daytona.snapshot.create({ name: "sdk-broken", image }, { timeout: 60 }).then(() => undefined, (e: unknown) => e as Error);
  expect(err).toBeInstanceOf(Error);
  expect(err!.message).toMatch(/^Failed to create snapshot\. Name: sdk-broken Reason: [\s\S]*exit status 3/);
  const row = await daytona.snapshot.get("sdk-broken");
  expect(row.state).toBe("build_failed");
}, 300_000);
