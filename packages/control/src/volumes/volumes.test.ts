import { lstat, readFile, stat, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes, randomUUID } from "node:crypto";
import { hashApiKey, keyEnds } from "../auth/key-material.ts";
import { ApiKeyRecord } from "../db/entities.ts";
import { execIn } from "../db/exec.ts";
import { volumeService } from "./service.ts";
import { loadSettings } from "../settings.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "../sandboxes/testing/fixtures.ts";
import type { UntypedJson } from "../casts.ts";

// Volumes over REST against a real server (embedded PostgreSQL) whose sandboxes are real
// (overlayfs, namespaces, a host uid per sandbox), run by the stand-in agent.

let f: SandboxFixture;
beforeAll(async () => {
  // Webhook events are read from the outbox; the endpoint (a closed loopback port) needs private delivery allowed.
  f = await sandboxFixture({ webhooks: { ...loadSettings({}).webhooks, allowPrivate: true } });
  const res = await f.call("POST", `/webhooks/organizations/${f.orgId}/endpoints`, { url: "http://127.0.0.1:9/hook" });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
});
afterAll(() => f?.stop());

async function expectError(res: { status: number; body: UntypedJson }, status: number, message: string | RegExp) {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  if (typeof message === "string") expect(res.body.message).toBe(message);
  else expect(res.body.message).toMatch(message);
}

/** A new API key of the organization (its first member's) with these scopes. */
async function keyFor(orgId: string, permissions: string[]): Promise<string> {
  const em = f.t.server.orm.em.fork();
  const [{ user_id: userId }] = (await execIn(em)(`select user_id from organization_member where organization_id = ? limit 1`, [orgId])) as Array<{ user_id: string }>;
  const key = "sbr_" + randomBytes(32).toString("hex");
  const { prefix, suffix } = keyEnds(key);
  em.create(ApiKeyRecord, {
    id: randomUUID(), organizationId: orgId, userId, name: `key-${randomUUID()}`, keyHash: hashApiKey(key), keyPrefix: prefix, keySuffix: suffix,
    permissions, createdByKeyHash: null, createdAt: new Date(), lastUsedAt: null, expiresAt: null,
  });
  await em.flush();
  return key;
}

async function newVolume(name: string): Promise<{ id: string; name: string; state: string }> {
  const res = await f.call("POST", "/volumes", { name });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

const hostPath = (id: string) => f.t.server.sandboxes.volumes.hostPath(id);

async function events(volumeId: string): Promise<Array<Record<string, string>>> {
  const rows = (await execIn(f.t.server.orm.em.fork())(`select body from webhook_message where event_type like 'volume.%' order by created_at, id`, [])) as Array<{ body: unknown }>;
  return rows.map((r) => (typeof r.body === "string" ? JSON.parse(r.body) : r.body) as Record<string, string>).filter((b) => b.id === volumeId);
}

describe("volume lifecycle", () => {
  it("creates, lists, reads by id and name, deletes (renamed, name freed) with an event per change", async () => {
    const v = await newVolume("data");
    expect(v).toMatchObject({ name: "data", organizationId: f.orgId, state: "ready" });
    expect((await stat(hostPath(v.id))).isDirectory()).toBe(true);
    expect((await f.call("GET", `/volumes/${v.id}`)).body).toMatchObject({ id: v.id, name: "data", state: "ready" });
    expect((await f.call("GET", "/volumes/by-name/data")).body).toMatchObject({ id: v.id });
    expect((await f.call("GET", "/volumes")).body.map((x: { id: string }) => x.id)).toContain(v.id);
    await expectError(await f.call("POST", "/volumes", { name: "data" }), 400, "Volume with name data already exists");

    const unnamed = await newVolume("");
    expect(unnamed.name).toBe(unnamed.id);

    expect((await f.call("DELETE", `/volumes/${v.id}`)).status).toBe(200);
    expect(await stat(hostPath(v.id)).catch(() => undefined)).toBeUndefined();
    expect((await f.call("GET", "/volumes")).body.map((x: { id: string }) => x.id)).not.toContain(v.id);
    const all = (await f.call("GET", "/volumes?includeDeleted=true")).body as Array<{ id: string; name: string; state: string }>;
    expect(all.find((x) => x.id === v.id)).toMatchObject({ name: "data-deleted", state: "deleted" });
    await expectError(await f.call("GET", "/volumes/by-name/data"), 404, "Volume with name data not found");
    await expectError(await f.call("DELETE", `/volumes/${v.id}`), 404, `Volume with ID ${v.id} not found`);
    // The name is free again.
    const again = await newVolume("data");
    expect(again.id).not.toBe(v.id);

    await eventually("the events", async () => (await events(v.id)).length === 6);
    expect((await events(v.id)).map((e) => (e.event === "volume.created" ? `created:${e.state}` : `${e.oldState}>${e.newState}`))).toEqual([
      "created:pending_create",
      "pending_create>creating",
      "creating>ready",
      "ready>pending_delete",
      "pending_delete>deleting",
      "deleting>deleted",
    ]);
  });

  it("carries on, at start, a create or delete a stopped process left half way", async () => {
    const exec = execIn(f.t.server.orm.em.fork());
    const [made, removing] = [randomUUID(), randomUUID()];
    await exec(`insert into volume (id, organization_id, name, state, created_at, updated_at) values (?, ?, 'half-made', 'creating', now(), now()), (?, ?, 'half-gone', 'deleting', now(), now())`, [made, f.orgId, removing, f.orgId]);
    await f.t.server.sandboxes.volumes.create(removing);
    volumeService(f.t.server.orm, f.t.server.sandboxes.volumes); // what a (re)starting process does
    await eventually("both finished", async () => (await f.call("GET", `/volumes/${made}`)).body.state === "ready" && (await f.call("GET", `/volumes/${removing}`)).body.state === "deleted");
    expect((await stat(hostPath(made))).isDirectory()).toBe(true);
    expect(await stat(hostPath(removing)).catch(() => undefined)).toBeUndefined();
    expect((await f.call("GET", `/volumes/${removing}`)).body.name).toBe("half-gone-deleted");
  });

  it("answers the messages the clients match on, and refuses bad names", async () => {
    // SDK `volume.get(name, true)` creates the volume on exactly this message.
    await expectError(await f.call("GET", "/volumes/by-name/nothing-here"), 404, "Volume with name nothing-here not found");
    await expectError(await f.call("GET", "/volumes/not-a-uuid"), 404, "Volume with ID not-a-uuid not found");
    await expectError(await f.call("GET", "/volumes/00000000-0000-4000-8000-000000000000"), 404, "Volume with ID 00000000-0000-4000-8000-000000000000 not found");
    await expectError(await f.call("POST", "/volumes", { name: "<b>x</b>" }), 400, /name must not contain HTML tags/);
    await expectError(await f.call("POST", "/volumes", { name: "x-deleted" }), 400, "name must not end with '-deleted'");
  });

  it("enforces the organization's volume quota", async () => {
    const exec = execIn(f.t.server.orm.em.fork());
    const [{ n }] = (await exec(`select count(*)::int as n from volume where organization_id = ? and state <> 'deleted'`, [f.orgId])) as Array<{ n: number }>;
    expect((await f.call("GET", `/organizations/${f.orgId}/usage`)).body).toMatchObject({ currentVolumeUsage: n, totalVolumeQuota: 100 });
    await exec(`update organization set volume_quota = ? where id = ?`, [n, f.orgId]);
    try {
      await expectError(await f.call("POST", "/volumes", { name: "over" }), 400, `Volume quota exceeded. Maximum allowed: ${n}`);
    } finally {
      await exec(`update organization set volume_quota = 100 where id = ?`, [f.orgId]);
    }
  });

  it("shows another organization's volume to nobody else", async () => {
    const other = await f.otherOrganization();
    const v = await newVolume("mine");
    await expectError(await f.call("GET", `/volumes/${v.id}`, undefined, other.key), 403, /.+/); // no read:volumes on that key
    other.key = await keyFor(other.orgId, ["read:volumes", "write:volumes", "delete:volumes", "write:sandboxes"]);
    await expectError(await f.call("GET", `/volumes/${v.id}`, undefined, other.key), 404, `Volume with ID ${v.id} not found`);
    await expectError(await f.call("GET", "/volumes/by-name/mine", undefined, other.key), 404, "Volume with name mine not found");
    await expectError(await f.call("DELETE", `/volumes/${v.id}`, undefined, other.key), 404, `Volume with ID ${v.id} not found`);
    await expectError(await f.call("POST", "/sandbox", { volumes: [{ volumeId: v.id, mountPath: "/mnt/v" }] }, other.key), 404, `Volume '${v.id}' not found`);
    expect((await f.call("GET", "/volumes", undefined, other.key)).body).toEqual([]);
  });
});

describe("mounting", () => {
  it("shares a volume live between sandboxes of different host uids, across stop, start, archive and the sandboxes' deletion", async () => {
    const v = await newVolume("shared");
    const a = await f.create({ name: "vol-a", volumes: [{ volumeId: v.id, mountPath: "/data" }] });
    // An unset subpath is answered null, as the gateway answers every unset optional.
    expect(a.volumes).toEqual([{ volumeId: v.id, mountPath: "/data", subpath: null }]);
    // By name, too (answered as the id).
    const b = await f.create({ name: "vol-b", volumes: [{ volumeId: "shared", mountPath: "/home/sandbar/shared/" }] });
    expect(b.volumes).toEqual([{ volumeId: v.id, mountPath: "/home/sandbar/shared", subpath: null }]);
    const uidA = (await f.runtime.provider.inspect(a.id)).hostUid;
    const uidB = (await f.runtime.provider.inspect(b.id)).hostUid;
    expect(uidA).not.toBe(uidB);

    expect(await f.exec(a.id, "mkdir /data/dir && echo from-a > /data/dir/file && echo ok")).toEqual({ exitCode: 0, result: "ok\n" });
    expect((await f.exec(b.id, "cat ~/shared/dir/file")).result).toBe("from-a\n");
    // B changes A's file and writes into A's directory; A sees both at once.
    expect(await f.exec(b.id, "echo from-b >> ~/shared/dir/file && echo new > ~/shared/dir/b && echo ok")).toEqual({ exitCode: 0, result: "ok\n" });
    expect((await f.exec(a.id, "cat /data/dir/file /data/dir/b")).result).toBe("from-a\nfrom-b\nnew\n");
    expect((await readFile(path.join(hostPath(v.id), "dir", "file"), "utf8"))).toBe("from-a\nfrom-b\n");
    // The volume stays closed to host users other than root and the volume group.
    expect((await stat(hostPath(v.id))).mode & 0o7777).toBe(0o2770);

    await expectError(await f.call("DELETE", `/volumes/${v.id}`), 409, /^Volume cannot be deleted because it is in use by one or more sandboxes \(e\.g\. vol-[ab]\)$/);

    // Stop and start keep the mount.
    expect((await f.call("POST", `/sandbox/${a.id}/stop`)).status).toBe(200);
    expect((await f.call("POST", `/sandbox/${a.id}/start`)).status).toBe(200);
    expect((await f.exec(a.id, "cat /data/dir/b")).result).toBe("new\n");
    // Archive and restore keep it (the mounts are in the sandbox's row, not only on the host).
    expect((await f.call("POST", `/sandbox/${a.id}/stop`)).status).toBe(200);
    expect((await f.call("POST", `/sandbox/${a.id}/archive`)).body).toMatchObject({ state: "archived" });
    expect((await f.call("POST", `/sandbox/${a.id}/start`)).body).toMatchObject({ state: "started", volumes: [{ volumeId: v.id, mountPath: "/data" }] });
    expect(await f.exec(a.id, "echo after-archive > /data/c && cat /data/dir/b")).toEqual({ exitCode: 0, result: "new\n" });

    for (const s of [a, b]) expect((await f.call("DELETE", `/sandbox/${s.id}`)).status).toBe(200);
    await eventually("both sandboxes gone", async () => (await f.runtime.list()).every((s) => s.id !== a.id && s.id !== b.id));
    const c = await f.create({ volumes: [{ volumeId: v.id, mountPath: "/mnt/v" }] });
    expect((await f.exec(c.id, "cat /mnt/v/dir/file /mnt/v/c")).result).toBe("from-a\nfrom-b\nafter-archive\n");
    expect((await f.call("DELETE", `/sandbox/${c.id}`)).status).toBe(200);
    await eventually("the volume free", async () => (await f.call("DELETE", `/volumes/${v.id}`)).status === 200);
  });

  it("mounts a subpath (made when missing) and never follows a symlink out of the volume", async () => {
    const v = await newVolume("sub");
    const s = await f.create({ volumes: [{ volumeId: v.id, mountPath: "/work", subpath: "projects/one" }] });
    expect(s.volumes).toEqual([{ volumeId: v.id, mountPath: "/work", subpath: "projects/one" }]);
    expect(await f.exec(s.id, "echo hi > /work/x && ln -s /etc /work/escape && ln -s ../../.. /work/up && echo ok")).toEqual({ exitCode: 0, result: "ok\n" });
    expect(await readFile(path.join(hostPath(v.id), "projects", "one", "x"), "utf8")).toBe("hi\n");
    expect((await lstat(path.join(hostPath(v.id), "projects", "one", "escape"))).isSymbolicLink()).toBe(true);
    // A symlink planted on the host side as well: resolved there, it would be the host's /etc.
    await symlink("/etc", path.join(hostPath(v.id), "hostlink"));
    await writeFile(path.join(hostPath(v.id), "plain"), "file");
    for (const subpath of ["projects/one/escape", "projects/one/escape/ssh", "projects/one/up", "hostlink", "plain"]) {
      const res = await f.call("POST", "/sandbox", { volumes: [{ volumeId: v.id, mountPath: "/mnt/v", subpath }] });
      expect(res.status, `${subpath}: ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.message).toMatch(/^Sandbox failed to start: .*(is a symbolic link|is not a directory)/);
    }
  });

  it.each([
    [[{ mountPath: "relative" }], "Invalid mount path relative (must be absolute)"],
    [[{ mountPath: "/" }], "Invalid mount path / (cannot mount to the root directory)"],
    [[{ mountPath: "/proc" }], "Invalid mount path /proc (cannot mount to system directory)"],
    [[{ mountPath: "/etc/app" }], "Invalid mount path /etc/app (cannot mount to system directory)"],
    [[{ mountPath: "/usr/local" }], "Invalid mount path /usr/local (cannot mount to system directory)"],
    [[{ mountPath: "/opt/sandbar/x" }], "Invalid mount path /opt/sandbar/x (cannot mount to system directory)"],
    [[{ mountPath: "/a/../etc" }], "Invalid mount path /a/../etc (must not contain '/./', '/../' or '//')"],
    [[{ mountPath: "/a//b" }], "Invalid mount path /a//b (must not contain '/./', '/../' or '//')"],
    [[{ mountPath: "/data" }, { mountPath: "/data/x" }], "Invalid mount path /data/x (overlaps another volume's mount path /data)"],
    [[{ mountPath: "/d", subpath: "../x" }], "Invalid subpath ../x (must be relative, without '..' or '//')"],
    [[{ mountPath: "/d", subpath: "/abs" }], "Invalid subpath /abs (must be relative, without '..' or '//')"],
    [[{ mountPath: "/d", volumeId: "" }], "volumeId should not be empty"],
    [[{ mountPath: "/d", volumeId: "no-such-volume" }], "Volume 'no-such-volume' not found"],
  ])("refuses %j: %s", async (mounts, message) => {
    const v = (await f.call("GET", "/volumes/by-name/checks")).body.id ?? (await newVolume("checks")).id;
    const volumes = mounts.map((m) => ({ volumeId: v, ...m }));
    const res = await f.call("POST", "/sandbox", { volumes });
    await expectError(res, message.startsWith("Volume '") ? 404 : 400, message);
  });

  it("refuses a deleted volume", async () => {
    const v = await newVolume("gone");
    expect((await f.call("DELETE", `/volumes/${v.id}`)).status).toBe(200);
    await expectError(await f.call("POST", "/sandbox", { volumes: [{ volumeId: v.id, mountPath: "/d" }] }), 404, `Volume '${v.id}' not found`);
  });
});
