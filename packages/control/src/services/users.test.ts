import { createPublicKey, createPrivateKey } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { UserService } from "@sandbar/protocol/gen/sandbar/control/v1/user_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Organization, OrganizationMember, User } from "../db/entities.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";

// The user routes over real HTTP (and gRPC) against a real server and PostgreSQL: the caller's
// own account, and the operator's user administration with a personal organization per user.

let t: TestServer;
const call = (key: string | undefined, method: string, path: string, body?: unknown) => api(t.url, key, method, path, body);

beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t?.stop());

describe("users", () => {
  it("answers the caller's own account at /users/me", async () => {
    const me = await call(t.adminKey, "GET", "/users/me");
    expect(me.status).toBe(200);
    expect(me.body).toMatchObject({ id: "sandbar-admin", publicKeys: [] });
    expect(Date.parse(me.body.createdAt)).not.toBeNaN();
    expect(me.body.keyPair).toBeUndefined();
  });

  it("creates a user with an SSH key pair handed out once and a personal organization it owns", async () => {
    const res = await call(t.adminKey, "POST", "/admin/users", { id: "auth0|alice", name: "Alice", email: "alice@example.com", role: "user", emailVerified: true });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ id: "auth0|alice", name: "Alice", email: "alice@example.com", role: "user", emailVerified: true });
    const { privateKey, publicKey } = res.body.keyPair;
    expect(publicKey).toMatch(/^ssh-rsa AAAA[0-9A-Za-z+/=]+ sandbar$/);
    // The two halves belong together, and the key is RSA-4096.
    const priv = createPrivateKey(privateKey);
    expect(priv.asymmetricKeyDetails?.modulusLength).toBe(4096);
    const n = Buffer.from(createPublicKey(priv).export({ format: "jwk" }).n!, "base64url");
    expect(Buffer.from(publicKey.split(" ")[1], "base64").includes(n)).toBe(true);

    const em = t.server.orm.em.fork();
    const stored = await em.findOneOrFail(User, { id: "auth0|alice" });
    expect(stored.sshPublicKey).toBe(publicKey);
    expect(JSON.stringify(stored)).not.toContain("PRIVATE KEY");
    const personal = await em.findOneOrFail(Organization, { createdBy: "auth0|alice", personal: true });
    expect(await em.findOne(OrganizationMember, { organizationId: personal.id, userId: "auth0|alice" })).toMatchObject({ role: "owner" });

    // Listed and readable; the private key never again.
    const list = await call(t.adminKey, "GET", "/users");
    expect(list.status).toBe(200);
    expect(list.body.map((u: { id: string }) => u.id)).toEqual(expect.arrayContaining(["sandbar-admin", "auth0|alice"]));
    const one = await call(t.adminKey, "GET", `/admin/users/${encodeURIComponent("auth0|alice")}`);
    expect(one.status).toBe(200);
    expect(JSON.stringify(one.body) + JSON.stringify(list.body)).not.toContain("PRIVATE");

    // Regeneration hands out a new pair and keeps only its public half.
    const again = await call(t.adminKey, "POST", `/users/${encodeURIComponent("auth0|alice")}/regenerate-key-pair`);
    expect(again.status).toBe(201);
    expect(again.body.keyPair.publicKey).not.toBe(publicKey);
    expect((await t.server.orm.em.fork().findOneOrFail(User, { id: "auth0|alice" })).sshPublicKey).toBe(again.body.keyPair.publicKey);
  });

  it("refuses a taken id with 409 and leaves nothing half-created", async () => {
    const res = await call(t.adminKey, "POST", "/users", { id: "auth0|alice", name: "Other Alice" });
    expect(res.status).toBe(409);
    expect(res.body.message).toBe("User with ID auth0|alice already exists");
    expect(await t.server.orm.em.fork().count(Organization, { createdBy: "auth0|alice" })).toBe(1);
  });

  it.each([
    [{ id: "", name: "X" }, /id must be/],
    [{ id: "has space", name: "X" }, /id must be/],
    [{ id: "bob", name: "<b>Bob</b>" }, /name must not contain HTML/],
    [{ id: "bob", name: "" }, /name should not be empty/],
    [{ id: "bob", name: "Bob", email: "not-an-email" }, /email must be an email/],
    [{ id: "bob", name: "Bob", role: "root" }, /role/],
  ])("refuses %j with 400 naming the field", async (body, message) => {
    const res = await call(t.adminKey, "POST", "/admin/users", body);
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.message).toMatch(message);
    expect(await t.server.orm.em.fork().count(User, { id: "bob" })).toBe(0);
  });

  it("answers 404 for an unknown user", async () => {
    for (const [method, path] of [["GET", "/users/nobody"], ["POST", "/admin/users/nobody/regenerate-key-pair"]] as const) {
      const res = await call(t.adminKey, method, path);
      expect(res.status).toBe(404);
      expect(res.body.message).toBe("User with ID nobody not found");
    }
  });

  it("keeps user administration to system admins with a full-scope credential", async () => {
    const narrow = await call(t.adminKey, "POST", "/api-keys", { name: "narrow", permissions: ["write:sandboxes"] });
    expect(narrow.status).toBe(201);
    for (const [method, path, body] of [["GET", "/users", undefined], ["POST", "/admin/users", { id: "eve", name: "Eve" }], ["GET", "/users/sandbar-admin", undefined]] as const) {
      expect((await call(narrow.body.value, method, path, body)).status).toBe(403);
      expect((await call(undefined, method, path, body)).status).toBe(401);
    }
    // The caller's own account is open to any credential of theirs.
    expect((await call(narrow.body.value, "GET", "/users/me")).status).toBe(200);
  });

  it("answers account linking as the reference does without an identity-provider management API", async () => {
    // JWT-only routes: an API key is refused first.
    expect((await call(t.adminKey, "GET", "/users/account-providers")).status).toBe(401);
  });

  it("serves the same over gRPC", async () => {
    const users = createClient(UserService, createGrpcTransport({ baseUrl: t.url }));
    const me = await users.getAuthenticatedUser({}, { headers: { authorization: `Bearer ${t.adminKey}` } });
    expect(me.id).toBe("sandbar-admin");
    await expect(users.getUser({ id: "nobody" }, { headers: { authorization: `Bearer ${t.adminKey}` } })).rejects.toMatchObject({ code: 5 });
  });
});
