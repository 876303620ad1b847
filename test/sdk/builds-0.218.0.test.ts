import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import type { UntypedJson } from "../../packages/control/src/casts.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";
import { startRegistry, type TestRegistry } from "../../packages/runner/src/images/testing/registry.ts";
import { pushTestImage } from "../../packages/control/src/snapshots/testing/image.ts";
import { load, saveRegistry, startRealServer, type RealServer } from "./support.ts";

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

const getJson = async (path: string): Promise<UntypedJson> => (await fetch(`${s.apiUrl}${path}`, { headers: { authorization: `Bearer ${s.adminKey}` } })).json();

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "sandbar-sdk218-build-"));
  reg = await startRegistry();
  base = await pushTestImage(reg, scratch, "sdk/base:1.0");
  s = await startRealServer();
  await saveRegistry(s, reg);
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
  // The client follows the logs only once a poll (every 1 s) sees `building`: the build lasts longer
  // than that, or an idle machine finishes it before the first poll and there is nothing to follow.
  const image = sdk.Image.base(base).addLocalFile("/usr/bin/sleep", "/bin/sleep").runCommands("echo built > /built.txt", "sleep 2").addLocalFile(local, "/app/notes.txt").env({ BUILT: "yes" });
  const logs: string[] = [];
  const snap = await daytona.snapshot.create({ name: "sdk-build", image }, { onLogs: (l) => logs.push(l), timeout: 60 });
  expect(snap).toMatchObject({ name: "sdk-build", state: "active" });
  expect(snap.imageName).toMatch(/^daytona-[0-9a-f]{64}:daytona$/);
  expect(snap.buildInfo?.dockerfileContent).toContain(`COPY ${local} /app/notes.txt`);
  expect(snap.buildInfo?.contextHashes).toHaveLength(2);
  const text = logs.join("\n");
  expect(text).toContain("RUN echo built > /built.txt"); // buildah's own output, followed
  expect(logs.at(-1)).toBe("Created snapshot sdk-build (active)");

  const sandbox = await daytona.create({ snapshot: "sdk-build" }, { timeout: 120 });
  const r = await sandbox.process.executeCommand('cat /built.txt /app/notes.txt; echo "$BUILT|$GREETING"');
  expect(r.result).toBe("built\nfrom my laptop\nyes|hello world\n");
  await sandbox.delete();

  // The same Image again: the build is reused (no buildah run), under another name.
  const twin = await daytona.snapshot.create({ name: "sdk-build-2", image }, { timeout: 60 });
  expect(twin.state).toBe("active");
  expect(twin.ref).toBe(snap.ref);
  // (Done before the client's first poll, so it followed nothing: the recorded log says it was reused.)
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

it("create({image}, {onSnapshotCreateLogs}) uploads the context, follows the build (pending_build -> building_snapshot) and starts the sandbox", async () => {
  const dir = join(scratch, "site");
  await rm(dir, { recursive: true, force: true });
  await import("node:fs/promises").then((fs) => fs.mkdir(dir, { recursive: true }));
  await writeFile(join(dir, "index.html"), "<h1>hi</h1>\n");
  const image = sdk.Image.base(base).addLocalDir(dir, "/srv/site").runCommands("cat /srv/site/index.html > /copied.html").workdir("/srv");
  const logs: string[] = [];
  const sandbox = await daytona.create({ image, envVars: { WHO: "sdk" } }, { timeout: 120, onSnapshotCreateLogs: (l) => logs.push(l) });
  expect(sandbox.state).toBe("started");
  expect(logs.join("\n")).toContain("RUN cat /srv/site/index.html > /copied.html");
  const r = await sandbox.process.executeCommand('cat /copied.html; echo "$WHO"; pwd');
  expect(r.result).toBe("<h1>hi</h1>\nsdk\n/srv\n");
  const row = await getJson(`/sandbox/${sandbox.id}`);
  expect(row.buildInfo.snapshotRef).toMatch(/^daytona-[0-9a-f]{64}:daytona$/);
  expect(row.snapshot ?? null).toBeNull(); // the reference names no snapshot for a build
  // The recorded log, as GET /sandbox/{id}/build-logs answers it after the build.
  const recorded = await fetch(`${s.apiUrl}/sandbox/${sandbox.id}/build-logs`, { headers: { authorization: `Bearer ${s.adminKey}` } });
  expect(await recorded.text()).toMatch(/image sha256:[0-9a-f]{64} ready/);
  await sandbox.delete();
}, 300_000);

it("a context hash that is not in storage: the sandbox ends in build_failed naming it", async () => {
  const post = await fetch(`${s.apiUrl}/sandbox`, {
    method: "POST",
    headers: { authorization: `Bearer ${s.adminKey}`, "content-type": "application/json" },
    body: JSON.stringify({ buildInfo: { dockerfileContent: `FROM ${base}\nCOPY /x /x\n`, contextHashes: ["0123456789abcdef0123456789abcdef"] } }),
  });
  const created: UntypedJson = await post.json();
  expect(post.status, JSON.stringify(created)).toBe(200);
  expect(created.state).toBe("pending_build");
  let row: UntypedJson = created;
  await eventually("the build to fail", async () => (row = await getJson(`/sandbox/${created.id}`)).state === "build_failed", 60_000);
  expect(row.errorReason).toMatch(/Build context 0123456789abcdef0123456789abcdef not found in object storage/);
  const del = await fetch(`${s.apiUrl}/sandbox/${created.id}`, { method: "DELETE", headers: { authorization: `Bearer ${s.adminKey}` } });
  expect(del.status).toBe(200);
}, 120_000);

it("create({image: 'name:tag'}) builds the one-line Dockerfile the client sends (FROM, no context)", async () => {
  const sandbox = await daytona.create({ image: base }, { timeout: 120 });
  expect(sandbox.state).toBe("started");
  const row = await getJson(`/sandbox/${sandbox.id}`);
  expect(row.buildInfo).toMatchObject({ dockerfileContent: `FROM ${base}\n`, contextHashes: [] });
  expect((await sandbox.process.executeCommand("cat /app/hello.txt")).result).toBe("hello from the image\n");
  await sandbox.delete();
}, 300_000);
