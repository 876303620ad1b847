import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import { buildAgentBundle } from "../testing/agent-bundle.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { pushTestImage, registryAccount } from "./testing/image.ts";
import { eventually } from "../../../protocol/src/testing/eventually.ts";
import type { UntypedJson } from "../casts.ts";

// Snapshots from OCI images against a real control server (embedded PostgreSQL), a real registry
// on loopback (docker-registry with basic auth, fed images built here from files) and real
// sandboxes (root), with the image of testing/image.ts.

let t: TestServer;
let reg: TestRegistry;
let scratch: string;
let bundle: string;
let app: string;
const call = (verb: string, p: string, body?: unknown) => api(t.url, t.adminKey, verb, p, body);

/** The test registry behind a loopback proxy that holds connections until released. */
async function holdingProxy(): Promise<{ host: string; release(): void; close(): Promise<void> }> {
  let held = true;
  const waiting: Array<() => void> = [];
  const sockets = new Set<net.Socket>();
  const proxy = net.createServer((client) => {
    sockets.add(client);
    const connect = () => {
      const upstream = net.connect(Number(reg.host.split(":")[1]), "127.0.0.1");
      sockets.add(upstream);
      client.pipe(upstream).pipe(client);
      upstream.on("error", () => client.destroy());
      client.on("error", () => upstream.destroy());
    };
    if (held) waiting.push(connect);
    else connect();
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  const host = `127.0.0.1:${(proxy.address() as net.AddressInfo).port}`;
  proxies.add(host);
  return {
    host,
    release() {
      held = false;
      for (const c of waiting.splice(0)) c();
    },
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((r) => proxy.close(() => r()));
    },
  };
}

/** The registry's account for it and for every proxy in front of it. */
const proxies = new Set<string>();
function registryCredentials() {
  const account = registryAccount(reg);
  return (org: string, host: string) => account(org, proxies.has(host) ? reg.host : host);
}

const randomSuffix = () => Math.random().toString(36).slice(2, 8);

async function waitFor(id: string, states: string[], ms = 60_000): Promise<UntypedJson> {
  const until = Date.now() + ms;
  for (;;) {
    const r = await call("GET", `/snapshots/${id}`);
    if (states.includes(r.body.state)) return r.body;
    if (Date.now() > until) throw new Error(`snapshot ${id} still ${r.body.state}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-snapshots-"));
  reg = await startRegistry();
  app = await pushTestImage(reg, scratch);
  bundle = await buildAgentBundle("sandbar-snapshots-agent-");
  // The registry doubles as the Docker Hub mirror: unqualified names are pulled from it.
  t = await startTestServer({ settings: { agentBundle: bundle, registries: { mirror: reg.host, insecureRegistries: [] } }, control: { registryCredentials: registryCredentials() } });
}, 180_000);

afterAll(async () => {
  await t?.stop();
  await reg?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

describe("snapshots from images", () => {
  let snapshotId: string;

  it("creates a snapshot: pending, then pulling, then active; the build log follows the pull", async () => {
    const created = await call("POST", "/snapshots", { name: "app-snap", imageName: app });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    expect(created.body).toMatchObject({ name: "app-snap", imageName: app, general: false, cpu: 1, mem: 1, disk: 3 });
    expect(["pending", "pulling"]).toContain(created.body.state);
    snapshotId = created.body.id;

    // Followed while the pull runs: the stream ends when the pull does.
    const res = await fetch(`${t.url}/api/snapshots/${snapshotId}/build-logs?follow=true`, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(res.status).toBe(200);
    const log = await res.text();
    expect(log).toContain(`pulling ${app}`);
    expect(log).toMatch(/layer 2\/2 sha256:\w+ (unpacked|already present)/);
    expect(log).toMatch(/image sha256:[a-f0-9]{64} ready/);

    const active = await waitFor(snapshotId, ["active", "error"]);
    expect(active.errorReason ?? null).toBeNull();
    expect(active.state).toBe("active");
    expect(active.ref).toMatch(/^sha256:[a-f0-9]{64}$/);
    expect(active.size).toBeGreaterThan(0);
    expect(active.entrypoint).toEqual(["/bin/sh"]);
    // Read by name as well as id; the log stays readable once the pull is over.
    expect((await call("GET", "/snapshots/app-snap")).body.id).toBe(snapshotId);
    const after = await fetch(`${t.url}/api/snapshots/${snapshotId}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(await after.text()).toContain("ready");
  }, 120_000);

  it("lists the organization's snapshots with the default one as a general snapshot", async () => {
    const r = await call("GET", "/snapshots?limit=1&page=1");
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ total: 2, page: 1, totalPages: 2 });
    expect(r.body.items.map((s: { name: string }) => s.name)).toEqual(["app-snap"]); // its own first
    const all = await call("GET", "/snapshots");
    expect(all.body.items.map((s: { name: string; general: boolean; state: string }) => [s.name, s.general, s.state])).toEqual([
      ["app-snap", false, "active"],
      ["sandbar-default", true, "active"],
    ]);
    expect((await call("GET", "/snapshots?name=APP")).body.total).toBe(1);
    expect((await call("GET", "/images?limit=200")).body.total).toBe(2); // the earlier set's alias
    expect((await call("GET", "/snapshots?limit=201")).status).toBe(400);
  });

  it("boots a sandbox from the snapshot: the command sees the image's files and env, the request's env wins", async () => {
    const s = await call("POST", "/sandbox", { snapshot: "app-snap", env: { APP_MODE: "override" } });
    expect(s.status, JSON.stringify(s.body)).toBe(200);
    expect(s.body).toMatchObject({ state: "started", snapshot: "app-snap" });
    const r = await call("POST", `/toolbox/${s.body.id}/toolbox/process/execute`, { command: 'cat /app/hello.txt /etc/greeting; echo "$GREETING|$APP_MODE"; test -e /etc/debian_version && echo debian || echo not-debian; cat hello.txt' });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    // Relative paths start at the image's WORKDIR (/app), as the reference's toolbox does.
    expect(r.body).toEqual({ exitCode: 0, result: "hello from the image\nhi\nhello world|override\nnot-debian\nhello from the image\n" });
    expect((await call("GET", `/snapshots/${snapshotId}`)).body.lastUsedAt).toBeTruthy();

    // In use: not deleted.
    const refused = await call("DELETE", `/snapshots/${snapshotId}`);
    expect(refused.status).toBe(409);
    expect(refused.body.message).toBe(`Snapshot cannot be deleted because it is in use by one or more sandboxes (e.g. ${s.body.name})`);
    expect((await call("DELETE", `/sandbox/${s.body.id}`)).status).toBe(200);
  }, 120_000);

  it("answers the reference's 400s for names and images, 409 for a duplicate name", async () => {
    const cases: Array<[unknown, string]> = [
      [{ name: "x", imageName: "alpine:latest" }, 'Images with tag ":latest" are not allowed'],
      [{ name: "x", imageName: "alpine" }, "Image name must include a tag (e.g., ubuntu:22.04) or digest (@sha256:...)"],
      [{ name: "x", imageName: "Alpine:3" }, "Invalid image name format. Must be lowercase, may contain digits, dots, dashes, and single slashes between components"],
      [{ name: "x", imageName: "alpine@sha256:123" }, "Invalid digest format. Must be image@sha256:64_hex_characters"],
      [{ name: "bad name!", imageName: "alpine:3" }, "Invalid snapshot name format. May contain letters, digits, dots, colons, and dashes"],
      [{ name: "x" }, "Must specify an image name when not using a build info entry"],
      [{ name: "x", imageName: "alpine:3", gpu: 2 }, "gpu must not be greater than 1"],
      [{ name: "x", imageName: "alpine:3", buildInfo: { dockerfileContent: "FROM alpine:3" } }, "Cannot specify an image name when using a build info entry"],
      [{ name: "x", buildInfo: { dockerfileContent: "  " } }, "buildInfo.dockerfileContent should not be empty"],
      [{ name: "x", buildInfo: { dockerfileContent: "FROM alpine:3", contextHashes: ["../etc"] } }, `buildInfo.contextHashes: each value must be a context hash (letters, digits, '-' or '_'), got "../etc"`],
      [{ name: "x", buildInfo: { dockerfileContent: "FROM alpine:3" }, entrypoint: ["sh"] }, "Cannot specify an entrypoint when using a build info entry"],
    ];
    for (const [body, message] of cases) {
      const r = await call("POST", "/snapshots", body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.message).toBe(message);
    }
    const dup = await call("POST", "/snapshots", { name: "app-snap", imageName: app });
    expect(dup.status).toBe(409);
    expect(dup.body.message).toBe('Snapshot with name "app-snap" already exists for this organization');
    expect((await call("POST", "/snapshots", { name: "sandbar-default", imageName: app })).status).toBe(409);
  });

  it("deactivates in any state, as the reference: a pull under way is stopped, activation pulls again", async () => {
    for (const deactivate of [
      (id: string) => call("POST", `/snapshots/${id}/deactivate`),
      (id: string) => call("PATCH", `/snapshots/${id}/toggle`, { enabled: false }),
      (id: string) => call("PATCH", `/images/${id}/toggle`, { enabled: false }),
    ]) {
      const proxy = await holdingProxy();
      try {
        const r = await call("POST", "/snapshots", { name: `held-${randomSuffix()}`, imageName: `${proxy.host}/test/app:1.0` });
        expect(r.status).toBe(200);
        await waitFor(r.body.id, ["pulling"]);
        const off = await deactivate(r.body.id);
        expect(off.status, JSON.stringify(off.body)).toBeLessThan(300);
        // The pull was stopped before the answer: its log ends so, and nothing moves the snapshot on.
        const log = await fetch(`${t.url}/api/snapshots/${r.body.id}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } });
        expect(await log.text()).toMatch(/pull interrupted\n$/);
        expect((await call("GET", `/snapshots/${r.body.id}`)).body).toMatchObject({ state: "inactive", enabled: false });
        expect((await call("POST", `/snapshots/${r.body.id}/activate`)).body.state).toBe("pending");
        proxy.release();
        expect((await waitFor(r.body.id, ["active", "error"])).state).toBe("active");
        expect((await call("DELETE", `/snapshots/${r.body.id}`)).status).toBe(200);
      } finally {
        await proxy.close();
      }
    }
  });

  it("an unknown tag ends in `error` with the reason; sandboxes from unknown or inactive snapshots are refused", async () => {
    const r = await call("POST", "/snapshots", { name: "missing", imageName: `${reg.host}/test/app:9.9` });
    expect(r.status).toBe(200);
    const failed = await waitFor(r.body.id, ["error", "active"]);
    expect(failed.state).toBe("error");
    expect(failed.errorReason).toMatch(/9\.9|not found|manifest unknown/i);

    expect((await call("POST", "/sandbox", { snapshot: "missing" })).body.message).toBe("Snapshot missing is error");
    const unknown = await call("POST", "/sandbox", { snapshot: "nope" });
    expect(unknown.status).toBe(400);
    expect(unknown.body.message).toBe("Snapshot nope not found. Did you add it through the Daytona Dashboard?");

    expect((await call("POST", `/snapshots/${snapshotId}/deactivate`)).status).toBe(204);
    expect((await call("GET", `/snapshots/${snapshotId}`)).body).toMatchObject({ state: "inactive", enabled: false });
    expect((await call("POST", "/sandbox", { snapshot: "app-snap" })).body.message).toBe("Snapshot app-snap is inactive");
    expect((await call("POST", `/snapshots/${snapshotId}/activate`)).body.state).toBe("active");
    expect((await call("POST", `/snapshots/${snapshotId}/activate`)).body.message).toBe(`Snapshot ${snapshotId} is already active`);
    expect((await call("PATCH", `/images/${snapshotId}/toggle`, { enabled: false })).body.enabled).toBe(false);
    expect((await call("PATCH", `/images/${snapshotId}/toggle`, {})).body.state).toBe("active");

    expect((await call("DELETE", `/snapshots/${r.body.id}`)).status).toBe(200);
    expect((await call("GET", `/snapshots/${r.body.id}`)).status).toBe(404);
    const general = await call("DELETE", "/snapshots/sandbar-default");
    expect(general.status).toBe(403);
    expect(general.body.message).toBe("You cannot delete a general snapshot");
  }, 90_000);

  it("pulls unqualified (Docker Hub) names from the mirror, with the mirror's credentials", async () => {
    const r = await call("POST", "/snapshots", { name: "hub-snap", imageName: "test/app:1.0" });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const active = await waitFor(r.body.id, ["active", "error"]);
    expect(active.errorReason ?? null).toBeNull();
    // The same image as app-snap's (same manifest), named as the user wrote it.
    expect(active).toMatchObject({ state: "active", imageName: "test/app:1.0", ref: (await call("GET", "/snapshots/app-snap")).body.ref });
    const log = await (await fetch(`${t.url}/api/snapshots/${r.body.id}/build-logs`, { headers: { authorization: `Bearer ${t.adminKey}` } })).text();
    expect(log).toContain(`pulling docker.io/test/app:1.0 from ${reg.host}`);
    expect((await call("DELETE", `/snapshots/${r.body.id}`)).status).toBe(200);
  }, 60_000);

  it("refuses a snapshot over the organization's snapshot quota", async () => {
    const org = (await call("GET", "/snapshots/app-snap")).body.organizationId;
    const own = (await call("GET", "/snapshots")).body.items.filter((i: { general: boolean }) => !i.general).length;
    expect((await call("PATCH", `/organizations/${org}/quota`, { snapshotQuota: own })).status).toBe(200);
    const r = await call("POST", "/snapshots", { name: "one-too-many", imageName: app });
    expect(r.status).toBe(400);
    expect(r.body.message).toBe(`Snapshot quota exceeded. Maximum allowed: ${own}`);
    expect((await call("PATCH", `/organizations/${org}/quota`, { snapshotQuota: 30 })).status).toBe(200);
  });

  it("takes the earlier set's CreateImage on /images (the name is the image) and the operator's general flag", async () => {
    const r = await call("POST", "/images", { name: app });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body).toMatchObject({ name: app, imageName: app, enabled: true });
    expect((await waitFor(r.body.id, ["active", "error"])).state).toBe("active");
    expect((await call("GET", `/images/${r.body.id}`)).body.name).toBe(app);

    const general = await call("PATCH", `/snapshots/${r.body.id}/general`, { general: true });
    expect(general.status).toBe(200);
    expect(general.body.general).toBe(true);
    expect(general.body.organizationId ?? null).toBeNull();
    // A general snapshot is listed after the organization's own, and not deleted.
    expect((await call("GET", "/snapshots")).body.items.filter((i: { general: boolean }) => i.general).map((i: { name: string }) => i.name).sort()).toEqual([app, "sandbar-default"].sort());
    expect((await call("DELETE", `/images/${r.body.id}`)).status).toBe(403);
    expect((await call("PATCH", `/images/${r.body.id}/general`, { general: false })).body.general).toBe(false);
    expect((await call("DELETE", `/images/${r.body.id}`)).status).toBe(200);
  }, 60_000);

  it("follows the build log of a pull in progress until it ends", async () => {
    const proxy = await holdingProxy();
    try {
      const r = await call("POST", "/snapshots", { name: "followed", imageName: `${proxy.host}/test/app:1.0` });
      expect(r.status).toBe(200);
      await waitFor(r.body.id, ["pulling"]);
      const res = await fetch(`${t.url}/api/snapshots/${r.body.id}/build-logs?follow=true`, { headers: { authorization: `Bearer ${t.adminKey}` } });
      expect(res.status).toBe(200);
      const reader = res.body!.getReader();
      const first = new TextDecoder().decode((await reader.read()).value);
      expect(first).toBe(`pulling ${proxy.host}/test/app:1.0\n`);
      // Still pulling (the registry is held): the stream waits for more.
      expect((await call("GET", `/snapshots/${r.body.id}`)).body.state).toBe("pulling");
      proxy.release();
      let rest = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        rest += new TextDecoder().decode(value);
      }
      // The same manifest as app-snap's: its root is on this host already, nothing is unpacked again.
      expect(rest).toMatch(/^image sha256:[a-f0-9]{64} ready \(\d+ bytes\)\n$/);
      expect((await call("GET", `/snapshots/${r.body.id}`)).body.state).toBe("active");
      expect((await call("DELETE", `/snapshots/${r.body.id}`)).status).toBe(200);
    } finally {
      await proxy.close();
    }
  }, 60_000);

  it("records snapshot webhook events in the transaction of each change", async () => {
    // An endpoint subscribed to snapshot events, disabled afterwards so nothing is sent from here.
    const org = (await call("GET", "/snapshots/app-snap")).body.organizationId;
    const ep = await call("POST", `/webhooks/organizations/${org}/endpoints`, { url: "https://example.com/hook", eventTypes: ["snapshot.created", "snapshot.state.updated", "snapshot.removed"] });
    expect(ep.status, JSON.stringify(ep.body)).toBeLessThan(300);
    const s = await call("POST", "/snapshots", { name: "evented", imageName: app });
    await waitFor(s.body.id, ["active"]);
    expect((await call("DELETE", `/snapshots/${s.body.id}`)).status).toBe(200);
    const rows = (await t.server.orm.em.getConnection().execute(`select event_type, body from webhook_message where organization_id = ? order by created_at`, [org])) as Array<{ event_type: string; body: string }>;
    const events = rows.map((r) => JSON.parse(r.body)).filter((b) => b.id === s.body.id);
    expect(events.map((e) => e.event + (e.newState ? `:${e.oldState}->${e.newState}` : ""))).toEqual([
      "snapshot.created",
      "snapshot.state.updated:pending->pulling",
      "snapshot.state.updated:pulling->active",
      "snapshot.state.updated:active->removing",
      "snapshot.removed",
    ]);
  }, 90_000);

  it("deleting the last snapshot of an image removes the image from this host", async () => {
    const ref = (await call("GET", "/snapshots/app-snap")).body.ref as string;
    const store = await t.server.sandboxes.runtime.images!();
    expect(await store.get(ref)).toBeDefined();
    expect((await call("DELETE", "/snapshots/app-snap")).status).toBe(200);
    expect(await store.get(ref)).toBeUndefined();
    expect((await call("GET", "/snapshots/app-snap")).status).toBe(404);
  });
});

describe("a restart during a pull", () => {
  it("resumes the pull: the snapshot does not stay `pulling`", async () => {
    // The pull is certainly in progress when the server stops.
    const proxy = await holdingProxy();
    const { host } = proxy;
    const control = { registryCredentials: registryCredentials() };
    const dataDir = await mkdtemp(path.join(os.tmpdir(), "sandbar-snapshots-restart-"));
    let server = await startTestServer({ dataDir, adminKey: t.adminKey, settings: { agentBundle: bundle }, control });
    const at = (s: TestServer) => (verb: string, p: string, body?: unknown) => api(s.url, s.adminKey, verb, p, body);
    try {
      const created = await at(server)("POST", "/snapshots", { name: "resumed", imageName: `${host}/test/app:1.0` });
      expect(created.status).toBe(200);
      await eventually("the pull to start", async () => (await at(server)("GET", "/snapshots/resumed")).body.state === "pulling");
      await server.stop({ keepData: true });

      proxy.release();
      server = await startTestServer({ dataDir, adminKey: t.adminKey, settings: { agentBundle: bundle }, control });
      let row = (await at(server)("GET", "/snapshots/resumed")).body;
      await eventually("the resumed pull to settle", async () => ["active", "error"].includes((row = (await at(server)("GET", "/snapshots/resumed")).body).state), 60_000);
      expect(row.errorReason ?? null).toBeNull();
      expect(row.state).toBe("active");
      expect(row.ref).toMatch(/^sha256:/);
    } finally {
      await server.stop({ keepData: true });
      await rm(dataDir, { recursive: true, force: true });
      await proxy.close();
    }
  }, 180_000);
});
