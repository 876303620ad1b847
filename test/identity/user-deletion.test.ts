/**
 * Deleting a user (DELETE /admin/users/{id}, /users/{id}) on a real server with the built-in
 * issuer: a user signs in through the login form, is deleted by the operator, and then neither
 * their unexpired access token nor their refresh token works, and nothing of them comes back
 * (no user row, no personal organization). The reference's rules: the personal organization
 * goes with the user, and a user who is the last owner of another organization is not deleted.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { setUserPassword } from "../../packages/control/src/identity/user-passwords.ts";
import { api, startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { discover, FormSignIn, tokenRequest, type Discovery } from "./oidc-client.ts";

let t: TestServer;
let oidc: Discovery;
let db: pg.Client;
let pool: pg.Pool;

beforeAll(async () => {
  t = await startTestServer();
  oidc = await discover(`${t.url}/oidc`);
  db = new pg.Client({ connectionString: t.server.databaseUrl });
  await db.connect();
  pool = new pg.Pool({ connectionString: t.server.databaseUrl, max: 2 });
});

afterAll(async () => {
  await db?.end();
  await pool?.end();
  await t?.stop();
});

const admin = (method: string, path: string, body?: unknown) => api(t.url, t.adminKey, method, path, body);
const count = async (sql: string, params: unknown[] = []) => (await db.query(sql, params)).rows[0].n as number;

/** A user made by the operator, with a password, signed in through the login form: their tokens. */
async function signedInUser(id: string): Promise<{ access: string; refresh: string }> {
  const made = await admin("POST", "/admin/users", { id, name: id, email: `${id}@example.test`, emailVerified: true, personalOrganizationDefaultRegionId: "local" });
  expect(made.status, JSON.stringify(made.body)).toBe(201);
  await setUserPassword(pool, id, `${id}'s long password`);
  const s = await FormSignIn.start(oidc);
  const done = await s.submit(`${id}@example.test`, `${id}'s long password`);
  expect(done.code, done.html).toBeTruthy();
  const tokens = await s.exchange(done.code!);
  expect(tokens.status).toBe(200);
  return { access: tokens.body.access_token!, refresh: tokens.body.refresh_token! };
}

describe("deleting a user", () => {
  it("is for operators: 403 to a user's token and to a user's key", async () => {
    const { access } = await signedInUser("nia");
    const org = (await db.query(`select id from organization where created_by = 'nia' and personal`)).rows[0].id as string;
    const key = await api(t.url, access, "POST", "/api-keys", { name: "all", permissions: [] }, { "x-sandbar-organization-id": org });
    expect(key.status).toBe(201);
    for (const credential of [access, key.body.value as string]) {
      for (const path of ["/admin/users/sandbar-admin", "/users/nia", "/admin/users/nobody"]) {
        const res = await api(t.url, credential, "DELETE", path);
        expect(res.status, path).toBe(403);
        expect(res.body.message).toBe("Access denied");
      }
    }
    expect(await count(`select count(*)::int as n from "user" where id = 'nia'`)).toBe(1);
  });

  it("refuses the caller themselves and the bootstrap admin, and answers 404 for an unknown user", async () => {
    expect((await admin("DELETE", "/admin/users/sandbar-admin")).body).toMatchObject({ statusCode: 403, message: "You cannot delete your own user" });
    expect((await admin("DELETE", "/admin/users/nobody")).body).toMatchObject({ statusCode: 404, message: "User with ID nobody not found" });
  });

  it("takes the user's personal organization, keys and sign-in with it; their tokens then get 401, re-create nothing and do not refresh", async () => {
    const { access, refresh } = await signedInUser("lin");
    expect((await api(t.url, access, "GET", "/users/me")).body).toMatchObject({ id: "lin" });
    const personal = (await db.query(`select id from organization where created_by = 'lin' and personal`)).rows[0].id as string;
    const inPersonal = { "x-sandbar-organization-id": personal };
    const key = (await api(t.url, access, "POST", "/api-keys", { name: "k", permissions: [] }, inPersonal)).body.value as string;
    expect((await api(t.url, key, "GET", "/api-keys/current")).status).toBe(200);
    // A member (not the last owner) of the operator's organization too.
    const defaultOrg = (await db.query(`select organization_id from organization_member where user_id = 'sandbar-admin'`)).rows[0].organization_id as string;
    await db.query(`insert into organization_member (organization_id, user_id, role) values ($1, 'lin', 'member')`, [defaultOrg]);
    expect(await count(`select count(*)::int as n from oidc_payload where payload->>'accountId' = 'lin'`)).toBeGreaterThan(0);

    const del = await admin("DELETE", "/admin/users/lin");
    expect(del.status, JSON.stringify(del.body)).toBe(204);

    const users = await count(`select count(*)::int as n from "user"`);
    const orgs = await count(`select count(*)::int as n from organization`);
    // The unexpired access token: 401 on every kind of route, and nothing is provisioned again.
    expect((await api(t.url, access, "GET", "/users/me")).status).toBe(401);
    expect((await api(t.url, access, "GET", "/organizations")).status).toBe(401);
    expect((await api(t.url, access, "GET", "/api-keys", undefined, inPersonal)).status).toBe(401);
    expect((await api(t.url, access, "POST", "/organizations", { name: "Back", defaultRegionId: "local" })).status).toBe(401);
    expect(await count(`select count(*)::int as n from "user"`)).toBe(users);
    expect(await count(`select count(*)::int as n from organization`)).toBe(orgs);
    expect(await count(`select count(*)::int as n from "user" where id = 'lin'`)).toBe(0);
    expect(await count(`select count(*)::int as n from organization where created_by = 'lin'`)).toBe(0);
    expect(await count(`select count(*)::int as n from organization_member where user_id = 'lin'`)).toBe(0);
    // The operator's view agrees.
    expect((await admin("GET", "/admin/users")).body.map((u: { id: string }) => u.id)).not.toContain("lin");
    expect((await admin("GET", "/admin/users/lin")).status).toBe(404);

    // The refresh token is refused, and the issuer holds nothing of theirs any more.
    const refreshed = await tokenRequest(oidc.token_endpoint, { grant_type: "refresh_token", refresh_token: refresh, client_id: "sandbar-cli" });
    expect(refreshed.status).toBe(400);
    expect(refreshed.body.error).toBe("invalid_grant");
    expect(await count(`select count(*)::int as n from oidc_payload where payload->>'accountId' = 'lin'`)).toBe(0);
    // Their key and their password are gone too.
    expect((await api(t.url, key, "GET", "/api-keys/current")).status).toBe(401);
    const again = await (await FormSignIn.start(oidc)).submit("lin@example.test", "lin's long password");
    expect(again.status).toBe(401);
    // Still nothing after all that, and a second delete finds no one.
    expect(await count(`select count(*)::int as n from "user" where id = 'lin'`)).toBe(0);
    expect((await admin("DELETE", "/users/lin")).status).toBe(404);
  });

  it("refuses (409) while the user is the last owner of another organization, naming it, and deletes once it is gone", async () => {
    const { access } = await signedInUser("max");
    const made = await api(t.url, access, "POST", "/organizations", { name: "Max Co", defaultRegionId: "local" });
    expect(made.status).toBe(201);
    const refused = await admin("DELETE", "/admin/users/max");
    expect(refused.status).toBe(409);
    expect(refused.body.message).toBe(`User max is the last owner of organization Max Co (${made.body.id}): make another member an owner or delete it first`);
    // Nothing was taken.
    expect(await count(`select count(*)::int as n from organization where created_by = 'max'`)).toBe(2);
    expect((await api(t.url, access, "GET", "/users/me")).status).toBe(200);

    expect((await api(t.url, access, "DELETE", `/organizations/${made.body.id}`)).status).toBe(204);
    expect((await admin("DELETE", "/admin/users/max")).status).toBe(204);
    expect((await api(t.url, access, "GET", "/users/me")).status).toBe(401);
    expect(await count(`select count(*)::int as n from organization where created_by = 'max'`)).toBe(0);
  });

  it("refuses (409) while their personal organization holds a sandbox, and deletes once it is gone", async () => {
    const { access } = await signedInUser("ora");
    const personal = (await db.query(`select id from organization where created_by = 'ora' and personal`)).rows[0].id as string;
    const h = { "x-sandbar-organization-id": personal };
    const sandbox = await api(t.url, access, "POST", "/sandbox", { autoStopInterval: 0 }, h);
    expect(sandbox.status, JSON.stringify(sandbox.body)).toBe(200);
    const refused = await admin("DELETE", "/admin/users/ora");
    expect(refused.body).toMatchObject({ statusCode: 409, message: `The personal organization ${personal} of user ora still has 1 sandbox: delete them first` });
    expect((await api(t.url, access, "GET", "/users/me")).status).toBe(200);
    expect((await api(t.url, access, "DELETE", `/sandbox/${sandbox.body.id}`, undefined, h)).status).toBe(200);
    expect((await admin("DELETE", "/admin/users/ora")).status).toBe(204);
    expect(await count(`select count(*)::int as n from sandbox where organization_id = $1`, [personal])).toBe(0);
  });

  it("records the deletion in the audit log", async () => {
    const rows = (await db.query(`select action, target_type, target_id, status_code from audit_log where target_type = 'user' and action = 'delete' order by created_at`)).rows;
    expect(rows).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ target_id: "lin", status_code: 204 }),
        expect.objectContaining({ target_id: "max", status_code: 409 }),
        expect.objectContaining({ target_id: "max", status_code: 204 }),
      ]),
    );
  });
});
