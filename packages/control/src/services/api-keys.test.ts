import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey, keyEnds } from "../auth/key-material.ts";
import { ApiKeyRecord, Organization, OrganizationMember, User } from "../db/entities.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "../../../protocol/src/testing/eventually.ts";

// The API-key routes over real HTTP against a real server and PostgreSQL.

let t: TestServer;
let orgId: string;
const call = (key: string | undefined, method: string, path: string, body?: unknown) => api(t.url, key, method, path, body);

beforeAll(async () => {
  t = await startTestServer();
  orgId = (await t.server.orm.em.fork().findOneOrFail(Organization, { createdBy: "sandbar-admin" })).id;
});
afterAll(() => t?.stop());

async function createKey(key: string, name: string, permissions: string[] = [], expiresAt?: string) {
  const res = await call(key, "POST", "/api-keys", { name, permissions, ...(expiresAt ? { expiresAt } : {}) });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.value as string;
}

describe("create, read, delete", () => {
  it("creates a key shown once in full, then masked everywhere", async () => {
    const res = await call(t.adminKey, "POST", "/api-keys", { name: "alpha", permissions: ["write:sandboxes", "read:volumes"] });
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ name: "alpha", permissions: ["write:sandboxes", "read:volumes"], expiresAt: null });
    expect(res.body.value).toMatch(/^sbr_[0-9a-f]{64}$/);
    const value: string = res.body.value;
    const masked = value.slice(0, 3) + "*".repeat(20) + value.slice(-3);

    const one = await call(t.adminKey, "GET", "/api-keys/alpha");
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ name: "alpha", value: masked, userId: "sandbar-admin", lastUsedAt: null });
    const list = await call(t.adminKey, "GET", "/api-keys");
    expect(list.status).toBe(200);
    expect(list.body.find((k: { name: string }) => k.name === "alpha").value).toBe(masked);
    expect(JSON.stringify(list.body)).not.toContain(value);

    const current = await call(value, "GET", "/api-keys/current");
    expect(current.status).toBe(200);
    expect(current.body).toMatchObject({ name: "alpha", value: masked, permissions: ["write:sandboxes", "read:volumes"] });
  });

  it("stores only the SHA-256 of a key", async () => {
    const value = await createKey(t.adminKey, "hashed");
    const row = await t.server.orm.em.fork().findOneOrFail(ApiKeyRecord, { name: "hashed" });
    expect(row.keyHash).toBe(hashApiKey(value));
    expect(JSON.stringify(row)).not.toContain(value.slice(4));
  });

  it("refuses a duplicate name with 409", async () => {
    await createKey(t.adminKey, "twice");
    const res = await call(t.adminKey, "POST", "/api-keys", { name: "twice", permissions: [] });
    expect(res.status).toBe(409);
    expect(res.body.message).toBe("API key with this name already exists");
  });

  it("deletes with 204 and the key fails on its very next request", async () => {
    const value = await createKey(t.adminKey, "doomed");
    expect((await call(value, "GET", "/api-keys/current")).status).toBe(200);
    const del = await call(t.adminKey, "DELETE", "/api-keys/doomed");
    expect(del.status).toBe(204);
    expect(del.body).toBeUndefined();
    expect((await call(value, "GET", "/api-keys/current")).status).toBe(401);
    expect((await call(t.adminKey, "GET", "/api-keys/doomed")).status).toBe(404);
    expect((await call(t.adminKey, "DELETE", "/api-keys/doomed")).body.message).toBe("API key not found");
  });

  it("enforces expiry", async () => {
    // A key born expired is refused (it could never be used).
    const past = await call(t.adminKey, "POST", "/api-keys", { name: "expired", permissions: [], expiresAt: new Date(Date.now() - 1000).toISOString() });
    expect(past).toMatchObject({ status: 400, body: { message: "expiresAt must be in the future" } });
    const soon = await createKey(t.adminKey, "soon", [], new Date(Date.now() + 3000).toISOString());
    const before = await call(soon, "GET", "/api-keys/current");
    expect(before.status).toBe(200);
    expect(before.body.expiresAt).toMatch(/^\d{4}-\d\d-\d\dT/);
    // Refused from its expiry on.
    await eventually("the key to expire", async () => (await call(soon, "GET", "/api-keys/current")).status === 401);
    expect(Date.now()).toBeGreaterThanOrEqual(Date.parse(before.body.expiresAt));
  });

  it("deleting a key for a user needs a JWT", async () => {
    const res = await call(t.adminKey, "DELETE", "/api-keys/sandbar-admin/alpha");
    expect(res.status).toBe(401);
    expect(res.body.message).toBe("Invalid credentials");
  });
});

describe("credentials", () => {
  it.each([
    ["no header", undefined],
    ["unknown key", "sbr_" + "0".repeat(64)],
    ["garbage", "not a key"],
    ["a JWT (no issuer configured)", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"],
  ])("answers 401 with the standard body for %s", async (_what, key) => {
    const res = await call(key, "GET", "/api-keys/current");
    expect(res.status).toBe(401);
    expect(res.body).toMatchObject({ statusCode: 401, error: "Unauthorized", message: "Invalid credentials", path: "/api/api-keys/current" });
    expect(Date.parse(res.body.timestamp)).not.toBeNaN();
  });

  it("answers a malformed Authorization header with 401", async () => {
    const res = await api(t.url, undefined, "GET", "/api-keys/current", undefined, { authorization: `Basic ${t.adminKey}` });
    expect(res.status).toBe(401);
  });
});

describe("managed keys", () => {
  it("a manager creates child keys only within its own scopes", async () => {
    const manager = await createKey(t.adminKey, "manager", ["manage:api_keys", "write:sandboxes"]);
    const over = await call(manager, "POST", "/api-keys", { name: "child-over", permissions: ["write:sandboxes", "delete:sandboxes", "read:volumes"] });
    expect(over.status).toBe(403);
    expect(over.body.message).toBe("Insufficient permissions for assigning: delete:sandboxes, read:volumes");
    const child = await createKey(manager, "child", ["write:sandboxes"]);

    // A child without manage:api_keys cannot manage keys.
    for (const [method, path, body] of [["POST", "/api-keys", { name: "x", permissions: [] }], ["GET", "/api-keys"], ["GET", "/api-keys/child"], ["DELETE", "/api-keys/child"]] as const) {
      const res = await call(child, method, path, body);
      expect(res.status, `${method} ${path}`).toBe(403);
      expect(res.body.message).toBe("This API key is not authorized to manage API keys");
    }
    // ...but may read itself.
    expect((await call(child, "GET", "/api-keys/current")).body.name).toBe("child");
  });

  it("a manager lists, reads and deletes only the keys it created", async () => {
    const m1 = await createKey(t.adminKey, "m1", ["manage:api_keys"]);
    const m2 = await createKey(t.adminKey, "m2", ["manage:api_keys"]);
    await createKey(m1, "of-m1");
    await createKey(m2, "of-m2");
    const list = await call(m1, "GET", "/api-keys");
    expect(list.body.map((k: { name: string }) => k.name)).toEqual(["of-m1"]);
    expect((await call(m1, "GET", "/api-keys/of-m2")).status).toBe(404);
    expect((await call(m1, "DELETE", "/api-keys/of-m2")).status).toBe(404);
    expect((await call(m1, "DELETE", "/api-keys/m1")).status).toBe(404);
    expect((await call(m2, "GET", "/api-keys/of-m2")).status).toBe(200);
    expect((await call(m1, "DELETE", "/api-keys/of-m1")).status).toBe(204);
  });

  it("a child granted manage:api_keys manages its own children", async () => {
    const parent = await createKey(t.adminKey, "parent", ["manage:api_keys", "write:snapshots"]);
    const sub = await createKey(parent, "sub-manager", ["manage:api_keys"]);
    await createKey(sub, "grandchild", []);
    expect((await call(sub, "GET", "/api-keys")).body.map((k: { name: string }) => k.name)).toEqual(["grandchild"]);
    const res = await call(sub, "POST", "/api-keys", { name: "x", permissions: ["write:snapshots"] });
    expect(res.status).toBe(403);
  });

  it("is switched per organization by the operator", async () => {
    const manager = await createKey(t.adminKey, "switched", ["manage:api_keys"]);
    const notAdmin = await call(manager, "PUT", `/admin/organizations/${orgId}/managed-api-keys`, { enabled: false });
    expect(notAdmin.status).toBe(403);
    expect(notAdmin.body.message).toBe("Access denied");
    expect((await call(t.adminKey, "PUT", `/admin/organizations/${randomUUID()}/managed-api-keys`, { enabled: false })).status).toBe(404);
    try {
      expect((await call(t.adminKey, "PUT", `/admin/organizations/${orgId}/managed-api-keys`, { enabled: false })).status).toBe(204);
      const res = await call(manager, "POST", "/api-keys", { name: "y", permissions: [] });
      expect(res.status).toBe(403);
      expect(res.body.message).toBe("Managing API keys with an API key is not enabled for this organization");
    } finally {
      await call(t.adminKey, "PUT", `/admin/organizations/${orgId}/managed-api-keys`, { enabled: true });
    }
  });

  it("keeps organizations apart: another organization's keys are not found", async () => {
    // A second organization with its own owner and manager key, made directly in the database.
    const em = t.server.orm.em.fork();
    const otherOrg = randomUUID();
    const value = "sbr_" + "ab".repeat(32);
    em.create(User, { id: "other-user", name: "Other", email: "", role: "user", createdAt: new Date() });
    em.create(Organization, { id: otherOrg, name: "Other", personal: false, createdBy: "other-user", managedApiKeys: true, createdAt: new Date(), updatedAt: new Date() });
    await em.flush();
    em.create(OrganizationMember, { organizationId: otherOrg, userId: "other-user", role: "owner", createdAt: new Date() });
    const { prefix, suffix } = keyEnds(value);
    em.create(ApiKeyRecord, {
      id: randomUUID(), organizationId: otherOrg, userId: "other-user", name: "other-manager", keyHash: hashApiKey(value),
      keyPrefix: prefix, keySuffix: suffix, permissions: ["manage:api_keys"], createdByKeyHash: null,
      createdAt: new Date(), lastUsedAt: null, expiresAt: null,
    });
    await em.flush();
    await createKey(value, "shared-name");
    await createKey(t.adminKey, "shared-name");
    expect((await call(value, "GET", "/api-keys")).body.map((k: { name: string }) => k.name)).toEqual(["shared-name"]);
    expect((await call(value, "GET", "/api-keys/alpha")).status).toBe(404);
    expect((await call(value, "DELETE", "/api-keys/alpha")).status).toBe(404);
    // Acting on another organization by path is refused.
    const res = await call(value, "PUT", `/admin/organizations/${orgId}/managed-api-keys`, { enabled: false });
    expect(res.status).toBe(403);
  });
});

describe("bad input gets a 400 that says what is wrong", () => {
  it.each<[string, unknown, string]>([
    ["malformed JSON", '{"name": "x",', "Invalid JSON in request body"],
    ["a body that is not an object", "[1,2]", "body must be an object"],
    ["a name of the wrong type", { name: 5, permissions: [] }, "name must be a string"],
    ["an empty name", { name: "  ", permissions: [] }, "name should not be empty"],
    ["an over-long name", { name: "n".repeat(256), permissions: [] }, "name must be shorter than or equal to 255 characters"],
    ["a name with markup", { name: "<b>x</b>", permissions: [] }, "name must not contain HTML tags, URLs, or control characters"],
    ["permissions not an array", { name: "x", permissions: "write:sandboxes" }, "permissions must be an array"],
    ["an unknown scope", { name: "x", permissions: ["write:everything"] }, "each value in permissions must be one of the following values: write:registries"],
    ["a bad date", { name: "x", permissions: [], expiresAt: "next tuesday" }, "expiresAt must be a valid ISO 8601 date string"],
    ["a date of the wrong type", { name: "x", permissions: [], expiresAt: 12 }, "expiresAt must be a valid ISO 8601 date string"],
  ])("%s", async (_what, body, message) => {
    const res = await call(t.adminKey, "POST", "/api-keys", body);
    expect(res.status).toBe(400);
    expect(res.body.statusCode).toBe(400);
    expect(res.body.message).toContain(message);
  });

  it("an unknown path is a 404 with the standard body", async () => {
    const res = await call(t.adminKey, "GET", "/no-such-thing");
    expect(res.status).toBe(404);
    expect(res.body).toMatchObject({ statusCode: 404, error: "Not Found", message: "Cannot GET /api/no-such-thing" });
  });

  it("a malformed percent-encoding in a path is a 400", async () => {
    expect((await call(t.adminKey, "GET", "/api-keys/%E0%A4%A")).status).toBe(400);
  });
});

describe("config", () => {
  it("answers without credentials", async () => {
    const res = await call(undefined, "GET", "/config");
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ version: expect.any(String), maxAutoArchiveInterval: 43200, maintananceMode: false });
    expect(res.body.proxyToolboxUrl).toMatch(/^http/);
  });
});
