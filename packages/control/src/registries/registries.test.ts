import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Code, ConnectError } from "@sandbar/protocol";
import { DockerRegistryService, RegistryType } from "@sandbar/protocol/gen/sandbar/control/v1/registry_pb.js";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { MAX_REGISTRIES_PER_ORGANIZATION } from "./service.ts";

// The registry API against a real server (embedded PostgreSQL), over REST and gRPC.

describe("docker registries", () => {
  const idp = new TestIssuer();
  let t: TestServer;
  let db: pg.Client;
  let other: string;
  let otherOrg: string;
  const call = (verb: string, path: string, body?: unknown, key = t.adminKey) => api(t.url, key, verb, path, body);
  const asOther = (verb: string, path: string, body?: unknown) => api(t.url, other, verb, path, body, { "x-sandbar-organization-id": otherOrg });
  const body = (over: Record<string, unknown> = {}) => ({ name: "Private", url: "https://registry.example.com", username: "robot", password: "s3cret-pw-1", project: "team", ...over });
  const row = async (id: string) => (await db.query(`select * from docker_registry where id = $1`, [id])).rows[0];

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k");
    t = await startTestServer({ settings: issuerSettings(idp) });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
    other = await idp.sign("k", { sub: "orla", email: "orla@example.test", name: "orla" });
    otherOrg = (await api(t.url, other, "GET", "/organizations")).body[0].id;
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  it("creates, lists newest first, gets, updates and deletes, never answering the password", async () => {
    const created = await call("POST", "/docker-registry", body());
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toEqual({
      id: expect.stringMatching(/^[0-9a-f-]{36}$/),
      name: "Private",
      url: "https://registry.example.com",
      username: "robot",
      project: "team",
      registryType: "organization",
      createdAt: expect.any(String),
      updatedAt: expect.any(String),
      isDefault: false,
    });
    const id = created.body.id as string;
    const second = (await call("POST", "/docker-registry", body({ name: "Hub", url: "docker.io", project: undefined }))).body;
    expect(second).toMatchObject({ url: "docker.io", project: "" });

    const list = await call("GET", "/docker-registry");
    expect(list.body.map((r: { id: string }) => r.id).slice(0, 2)).toEqual([second.id, id]);
    expect((await call("GET", `/docker-registry/${id}`)).body).toEqual(created.body);

    // PATCH: name, url and username always; an absent password or project stays as it was.
    const sealedBefore = (await row(id)).password_sealed;
    const patched = await call("PATCH", `/docker-registry/${id}`, { name: "Renamed", url: "HTTP://Registry.Example.com:5000/", username: "robot2" });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ id, name: "Renamed", url: "http://registry.example.com:5000", username: "robot2", project: "team" });
    expect(Date.parse(patched.body.updatedAt)).toBeGreaterThan(Date.parse(created.body.updatedAt));
    expect((await row(id)).password_sealed).toBe(sealedBefore);
    await call("PATCH", `/docker-registry/${id}`, { name: "Renamed", url: "registry.example.com", username: "robot2", password: "new-pw-2", project: "" });
    const after = await row(id);
    expect(after.password_sealed).not.toBe(sealedBefore);
    expect(after.project).toBe("");

    for (const res of [created, list, patched]) expect(JSON.stringify(res.body)).not.toMatch(/s3cret-pw-1|new-pw-2|password/i);

    expect((await call("DELETE", `/docker-registry/${id}`)).status).toBe(204);
    expect((await call("GET", `/docker-registry/${id}`)).body).toMatchObject({ statusCode: 404, message: `Docker registry with ID ${id} not found` });
    expect((await call("DELETE", `/docker-registry/${id}`)).status).toBe(404);
    expect(await row(id)).toBeUndefined();
  });

  it("stores the password sealed (AES-GCM), never in clear, not in the audit log either", async () => {
    const clear = "very-s3cret-registry-password";
    const { id } = (await call("POST", "/docker-registry", body({ password: clear }))).body;
    const stored = await row(id);
    expect(stored.password_sealed).toMatch(/^v1:[A-Za-z0-9+/=]+$/);
    const dump = JSON.stringify((await db.query(`select * from docker_registry`)).rows) + JSON.stringify((await db.query(`select * from audit_log`)).rows);
    expect(dump).not.toContain(clear);
    expect(dump).not.toContain(Buffer.from(clear).toString("base64"));
    // The same password sealed twice differs (a fresh IV each time): equal passwords are not visible as such.
    const twin = (await call("POST", "/docker-registry", body({ password: clear }))).body.id;
    expect((await row(twin)).password_sealed).not.toBe(stored.password_sealed);
  });

  it("refuses bad input with the reference's messages, each field named, all at once", async () => {
    const refused = async (b: unknown, path = "/docker-registry", verb = "POST") => {
      const res = await call(verb, path, b);
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      return res.body.message as string;
    };
    expect(await refused({ name: "", url: "", username: "", password: "" })).toBe(
      "name should not be empty, url must be a URL address, username should not be empty, password should not be empty",
    );
    for (const url of ["not a url", "ftp://registry.example.com", "https://user:pw@registry.example.com", "registry.example.com?x=1", "https://registry.example.com/#a", "justahost", "http://", "https://-bad-.example.com"]) {
      expect(await refused(body({ url })), url).toBe("url must be a URL address");
    }
    expect(await refused(body({ name: "<b>x</b>" }))).toBe("name must not contain HTML tags, URLs, or control characters");
    expect(await refused(body({ name: "see https://x.example" }))).toBe("name must not contain HTML tags, URLs, or control characters");
    expect(await refused(body({ username: "a:b" }))).toBe("username must not contain ':'");
    expect(await refused(body({ project: "Team/Upper" }))).toMatch(/^project must be lowercase letters and digits/);
    expect(await refused(body({ project: "a//b" }))).toMatch(/^project must be/);
    expect(await refused(body({ password: "x\u0000y" }))).toBe("password must not contain NUL characters");
    // Wrong JSON types are refused by the gateway, naming the field.
    expect(await refused({ ...body(), url: 12 })).toMatch(/url/);

    const { id } = (await call("POST", "/docker-registry", body({ url: "127.0.0.1:5000", project: "a.b/c-d" }))).body;
    expect(await refused({ name: "n", url: "registry.example.com", username: "u", password: "" }, `/docker-registry/${id}`, "PATCH")).toBe("password should not be empty");
    expect(await refused({ name: "n", url: "nope", username: "" }, `/docker-registry/${id}`, "PATCH")).toBe("url must be a URL address, username should not be empty");
    // Accepted forms: IPv4/IPv6 literals with ports, localhost, a path (Docker Hub's v1 URL).
    for (const url of ["localhost:5000", "[::1]:5000", "https://index.docker.io/v1/", "http://10.0.0.1"]) {
      expect((await call("POST", "/docker-registry", body({ url }))).status, url).toBe(201);
    }
    // Ids that are not UUIDs are simply not found.
    expect((await call("GET", "/docker-registry/not-a-uuid")).body).toMatchObject({ statusCode: 404, message: "Docker registry with ID not-a-uuid not found" });
  });

  it(`caps an organization at ${MAX_REGISTRIES_PER_ORGANIZATION} registries`, async () => {
    const org = (await asOther("GET", "/organizations")).body[0].id as string;
    expect(org).toBe(otherOrg);
    await db.query(
      `insert into docker_registry (organization_id, name, url, username, password_sealed) select $1, 'bulk-' || g, 'registry.example.com', 'u', 'v1:x' from generate_series(1, $2) g`,
      [otherOrg, MAX_REGISTRIES_PER_ORGANIZATION - 1],
    );
    expect((await asOther("POST", "/docker-registry", body())).status).toBe(201);
    expect((await asOther("POST", "/docker-registry", body())).body).toMatchObject({ statusCode: 400, message: "You have reached the maximum number of registries" });
    expect((await asOther("GET", "/docker-registry")).body).toHaveLength(MAX_REGISTRIES_PER_ORGANIZATION);
    await db.query(`delete from docker_registry where organization_id = $1`, [otherOrg]);
  });

  it("keeps one default per organization: set-default moves it, at once too, and the database refuses a second", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await asOther("POST", "/docker-registry", body({ name: `d${i}` }))).body.id);
    const defaults = async () => (await db.query(`select id from docker_registry where organization_id = $1 and is_default`, [otherOrg])).rows.map((r) => r.id);
    expect(await defaults()).toEqual([]);

    const first = await asOther("POST", `/docker-registry/${ids[0]}/set-default`);
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ id: ids[0], isDefault: true });
    expect((await asOther("POST", `/docker-registry/${ids[1]}/set-default`)).body.isDefault).toBe(true);
    expect(await defaults()).toEqual([ids[1]]);
    expect((await asOther("GET", `/docker-registry/${ids[0]}`)).body.isDefault).toBe(false);
    // Setting the default again is harmless.
    expect((await asOther("POST", `/docker-registry/${ids[1]}/set-default`)).status).toBe(200);
    expect(await defaults()).toEqual([ids[1]]);

    const all = await Promise.all(ids.map((id) => asOther("POST", `/docker-registry/${id}/set-default`)));
    expect(all.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    expect(await defaults()).toHaveLength(1);

    await expect(db.query(`update docker_registry set is_default = true where organization_id = $1`, [otherOrg])).rejects.toMatchObject({ code: "23505" });
    // Another organization's default is its own business.
    const mine = (await call("POST", "/docker-registry", body())).body.id;
    expect((await call("POST", `/docker-registry/${mine}/set-default`)).body.isDefault).toBe(true);
    expect(await defaults()).toHaveLength(1);

    // Deleting the default leaves the organization without one.
    const current = (await defaults())[0];
    expect((await asOther("DELETE", `/docker-registry/${current}`)).status).toBe(204);
    expect(await defaults()).toEqual([]);
  });

  it("needs write:registries and delete:registries; reading needs membership only", async () => {
    const { id } = (await call("POST", "/docker-registry", body())).body;
    const readOnly = (await call("POST", "/api-keys", { name: "reg-read", permissions: [] })).body.value;
    const writer = (await call("POST", "/api-keys", { name: "reg-write", permissions: ["write:registries"] })).body.value;
    for (const [verb, path, b] of [
      ["POST", "/docker-registry", body()],
      ["PATCH", `/docker-registry/${id}`, body()],
      ["POST", `/docker-registry/${id}/set-default`, undefined],
      ["DELETE", `/docker-registry/${id}`, undefined],
    ] as const) {
      expect((await call(verb, path, b, readOnly)).body, `${verb} ${path}`).toMatchObject({ statusCode: 403, message: "Access denied" });
    }
    expect((await call("GET", "/docker-registry", undefined, readOnly)).status).toBe(200);
    expect((await call("GET", `/docker-registry/${id}`, undefined, readOnly)).status).toBe(200);
    expect((await call("PATCH", `/docker-registry/${id}`, body({ name: "by-writer" }), writer)).body.name).toBe("by-writer");
    expect((await call("DELETE", `/docker-registry/${id}`, undefined, writer)).status).toBe(403);
    expect((await api(t.url, undefined, "GET", "/docker-registry")).status).toBe(401);
  });

  it("answers 404 for another organization's registry on every route, and lists only its own", async () => {
    const { id } = (await call("POST", "/docker-registry", body({ name: "admins" }))).body;
    for (const [verb, path, b] of [
      ["GET", `/docker-registry/${id}`, undefined],
      ["PATCH", `/docker-registry/${id}`, body({ name: "hijack" })],
      ["POST", `/docker-registry/${id}/set-default`, undefined],
      ["DELETE", `/docker-registry/${id}`, undefined],
    ] as const) {
      expect((await asOther(verb, path, b)).body, `${verb} ${path}`).toMatchObject({ statusCode: 404, message: `Docker registry with ID ${id} not found` });
    }
    expect((await asOther("GET", "/docker-registry")).body.map((r: { id: string }) => r.id)).not.toContain(id);
    expect(await row(id)).toMatchObject({ name: "admins", is_default: false });
  });

  it("serves the same over gRPC", async () => {
    const client = createClient(DockerRegistryService, createGrpcTransport({ baseUrl: t.url }));
    const headers = { authorization: `Bearer ${t.adminKey}` };
    const made = await client.createRegistry({ name: "grpc", url: "ghcr.io", username: "octo", password: "grpc-s3cret", project: "org" }, { headers });
    expect(made).toMatchObject({ name: "grpc", url: "ghcr.io", username: "octo", project: "org", registryType: RegistryType.ORGANIZATION, isDefault: false });
    expect((await client.listRegistries({}, { headers })).items.map((r) => r.id)).toContain(made.id);
    expect((await client.getRegistry({ id: made.id }, { headers })).name).toBe("grpc");
    expect((await client.updateRegistry({ id: made.id, name: "grpc2", url: "ghcr.io", username: "octo" }, { headers })).name).toBe("grpc2");
    expect((await client.setDefaultRegistry({ id: made.id }, { headers })).isDefault).toBe(true);
    await client.deleteRegistry({ id: made.id }, { headers });
    const gone = await client.getRegistry({ id: made.id }, { headers }).catch((e: unknown) => e);
    expect(gone).toBeInstanceOf(ConnectError);
    expect((gone as ConnectError).code).toBe(Code.NotFound);
    const bad = await client.createRegistry({ name: "x", url: "nope", username: "u", password: "p" }, { headers }).catch((e: unknown) => e);
    expect((bad as ConnectError).code).toBe(Code.InvalidArgument);
    expect((bad as ConnectError).rawMessage).toBe("url must be a URL address");
  });

  it("answers 503 with the reason for registry-push-access when the internal registry is off (push-access.test.ts covers it on)", async () => {
    const r = await call("GET", "/docker-registry/registry-push-access");
    expect(r.status).toBe(503);
    expect(r.body.message).toBe("The internal registry is off on this server (SANDBAR_INTERNAL_REGISTRY=off)");
  });
});
