import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { eventually } from "../../../protocol/src/testing/eventually.ts";

// Roles, members and invitations over REST on a real server, people signed in with JWTs from an
// independent issuer. Every change must hold on the very next request.

const DEVELOPER = "00000000-0000-0000-0000-000000000001";
const SANDBOXES_ADMIN = "00000000-0000-0000-0000-000000000002";

describe("roles, members and invitations", () => {
  const idp = new TestIssuer();
  let t: TestServer;
  let db: pg.Client;
  const jwt = (sub: string, verified = true) => idp.sign("k", { sub, email: `${sub}@example.test`, email_verified: verified, name: sub });

  beforeAll(async () => {
    await idp.start();
    await idp.addKey("k");
    t = await startTestServer({ settings: issuerSettings(idp) });
    db = new pg.Client({ connectionString: t.server.databaseUrl });
    await db.connect();
  });
  afterAll(async () => {
    await db?.end();
    await t?.stop();
    idp.stop();
  });

  /** An organization owned by `owner`, with `member` in it through an accepted invitation carrying `roles`. */
  async function team(owner: string, member?: string, roles: string[] = [DEVELOPER]) {
    const o = await jwt(owner);
    const org = (await api(t.url, o, "POST", "/organizations", { name: `${owner}'s team`, defaultRegionId: "local" })).body.id as string;
    if (member) {
      const m = await jwt(member);
      await api(t.url, m, "GET", "/organizations"); // signs in once (the user row)
      const inv = await api(t.url, o, "POST", `/organizations/${org}/invitations`, { email: `${member}@example.test`, role: "member", assignedRoleIds: roles });
      expect(inv.status, JSON.stringify(inv.body)).toBe(201);
      expect((await api(t.url, m, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
    }
    return { org, h: { "x-sandbar-organization-id": org } };
  }

  it("lists global roles with the organization's own, and lets only owners change its own", async () => {
    const { org } = await team("olga", "mo");
    const olga = await jwt("olga");
    const mo = await jwt("mo");
    const list = await api(t.url, mo, "GET", `/organizations/${org}/roles`);
    expect(list.body.slice(0, 8).map((r: { name: string }) => r.name)).toEqual([
      "Developer", "Sandboxes Admin", "Snapshots Admin", "Registries Admin", "Super Admin", "Volumes Admin", "Auditor", "Infrastructure Admin",
    ]);
    expect(list.body[0]).toMatchObject({ id: DEVELOPER, isGlobal: true, permissions: ["write:sandboxes"] });
    const body = { name: "Key keeper", description: "Manages keys", permissions: ["write:sandboxes", "delete:sandboxes"] };
    expect((await api(t.url, mo, "POST", `/organizations/${org}/roles`, body)).body).toMatchObject({ statusCode: 403, message: "Access denied" });
    const role = await api(t.url, olga, "POST", `/organizations/${org}/roles`, body);
    expect(role.status).toBe(201);
    expect(role.body).toMatchObject({ name: "Key keeper", description: "Manages keys", permissions: ["write:sandboxes", "delete:sandboxes"], isGlobal: false });
    expect((await api(t.url, olga, "POST", `/organizations/${org}/roles`, { ...body, permissions: [] })).body.message).toMatch(/permissions should not be empty/);
    expect((await api(t.url, olga, "POST", `/organizations/${org}/roles`, { ...body, permissions: ["fly:away"] })).status).toBe(400);
    const upd = await api(t.url, olga, "PUT", `/organizations/${org}/roles/${role.body.id}`, { ...body, name: "Keeper" });
    expect(upd.body.name).toBe("Keeper");
    expect((await api(t.url, olga, "PUT", `/organizations/${org}/roles/${DEVELOPER}`, body)).body).toMatchObject({ statusCode: 404, message: `Organization role with ID ${DEVELOPER} not found` });
    expect((await api(t.url, olga, "DELETE", `/organizations/${org}/roles/not-a-uuid`)).status).toBe(404);
    expect((await api(t.url, olga, "DELETE", `/organizations/${org}/roles/${role.body.id}`)).status).toBe(204);
    expect((await api(t.url, olga, "DELETE", `/organizations/${org}/roles/${role.body.id}`)).status).toBe(404);
  });

  it("takes a role's or a member's new permissions into account on the next request", async () => {
    const { org, h } = await team("pia", "quin", [DEVELOPER]);
    const pia = await jwt("pia");
    const quin = await jwt("quin");
    // Developer grants write:sandboxes: quin may hand it to a key, not delete:sandboxes.
    const ok = await api(t.url, quin, "POST", "/api-keys", { name: "w", permissions: ["write:sandboxes"] }, h);
    expect(ok.status, JSON.stringify(ok.body)).toBe(201);
    expect((await api(t.url, quin, "POST", "/api-keys", { name: "d", permissions: ["delete:sandboxes"] }, h)).body.message).toBe(
      "Insufficient permissions for assigning: delete:sandboxes",
    );
    // An organization role with delete:sandboxes assigned: the very next request may.
    const role = (await api(t.url, pia, "POST", `/organizations/${org}/roles`, { name: "Deleter", description: "d", permissions: ["delete:sandboxes"] })).body;
    const acc = await api(t.url, pia, "POST", `/organizations/${org}/users/quin/assigned-roles`, { assignedRoleIds: [DEVELOPER, role.id] });
    expect(acc.status, JSON.stringify(acc.body)).toBe(200);
    expect(acc.body.assignedRoles.map((r: { name: string }) => r.name).sort()).toEqual(["Deleter", "Developer"]);
    expect((await api(t.url, quin, "POST", "/api-keys", { name: "d", permissions: ["delete:sandboxes"] }, h)).status).toBe(201);
    // The role loses the permission: effective at once (the key made with it stays, unable to use it; deleting keys is the rule below).
    await api(t.url, pia, "PUT", `/organizations/${org}/roles/${role.id}`, { name: "Deleter", description: "d", permissions: ["read:volumes"] });
    expect((await api(t.url, quin, "POST", "/api-keys", { name: "d2", permissions: ["delete:sandboxes"] }, h)).status).toBe(403);
    // A role in use cannot be deleted.
    expect((await api(t.url, pia, "DELETE", `/organizations/${org}/roles/${role.id}`)).status).toBe(409);
    // Access shrinks to nothing: the keys using what quin lost are deleted, in the same transaction.
    expect((await api(t.url, ok.body.value, "GET", "/api-keys/current")).status).toBe(200);
    const shrink = await api(t.url, pia, "POST", `/organizations/${org}/users/quin/access`, { role: "member", assignedRoleIds: [] });
    expect(shrink.status).toBe(200);
    expect((await api(t.url, ok.body.value, "GET", "/api-keys/current")).status).toBe(401);
    expect((await db.query(`select name from api_key where user_id = 'quin' and organization_id = $1 order by name`, [org])).rows.map((r) => r.name)).toEqual(["d"]);
    // Promoted to owner: owner routes open on the next request.
    expect((await api(t.url, quin, "POST", `/organizations/${org}/roles`, { name: "x", description: "x", permissions: ["read:volumes"] })).status).toBe(403);
    expect((await api(t.url, pia, "POST", `/organizations/${org}/users/quin/role`, { role: "owner" })).body.role).toBe("owner");
    expect((await api(t.url, quin, "POST", `/organizations/${org}/roles`, { name: "x", description: "x", permissions: ["read:volumes"] })).status).toBe(201);
  });

  it("keeps an owner: no self-update, no demoting or removing the last one", async () => {
    const { org } = await team("rae", "sam");
    const rae = await jwt("rae");
    expect((await api(t.url, rae, "POST", `/organizations/${org}/users/rae/role`, { role: "member" })).body).toMatchObject({ statusCode: 403, message: "You cannot update your own access" });
    expect((await api(t.url, rae, "DELETE", `/organizations/${org}/users/rae`)).body).toMatchObject({ statusCode: 403, message: `Organization with ID ${org} must have at least one owner` });
    expect((await api(t.url, rae, "POST", `/organizations/${org}/users/nobody/role`, { role: "member" })).body).toMatchObject({
      statusCode: 404,
      message: `User with ID nobody not found in organization with ID ${org}`,
    });
    expect((await api(t.url, rae, "POST", `/organizations/${org}/users/sam/access`, { role: "admin", assignedRoleIds: [] })).status).toBe(400);
    expect((await api(t.url, rae, "POST", `/organizations/${org}/users/sam/access`, { role: "member", assignedRoleIds: ["x"] })).body.message).toBe("One or more role IDs are invalid");
    // Two owners: one may demote the other, who then cannot demote back.
    await api(t.url, rae, "POST", `/organizations/${org}/users/sam/role`, { role: "owner" });
    const sam = await jwt("sam");
    expect((await api(t.url, sam, "POST", `/organizations/${org}/users/rae/role`, { role: "member" })).status).toBe(200);
    expect((await api(t.url, rae, "POST", `/organizations/${org}/users/sam/role`, { role: "member" })).status).toBe(403);
    expect((await api(t.url, sam, "GET", `/organizations/${org}/users`)).body.map((m: { userId: string; role: string }) => `${m.userId}:${m.role}`).sort()).toEqual(["rae:member", "sam:owner"]);
    expect((await api(t.url, sam, "DELETE", `/organizations/${org}/users/rae`)).status).toBe(204);
    expect((await api(t.url, rae, "GET", `/organizations/${org}`)).status).toBe(404);
  });

  it("runs the invitation lifecycle: create, list, count, update, accept, decline, cancel, expire", async () => {
    const { org } = await team("tess");
    const tess = await jwt("tess");
    const uma = await jwt("uma");
    await api(t.url, uma, "GET", "/organizations");
    const url = `/organizations/${org}/invitations`;
    expect((await api(t.url, tess, "POST", url, { email: "not an email", role: "member", assignedRoleIds: [] })).status).toBe(400);
    expect((await api(t.url, tess, "POST", url, { email: "uma@example.test", assignedRoleIds: [] })).status).toBe(400);
    const inv = await api(t.url, tess, "POST", url, { email: " UMA@example.test ", role: "member", assignedRoleIds: [DEVELOPER] });
    expect(inv.status).toBe(201);
    expect(inv.body).toMatchObject({ email: "uma@example.test", invitedBy: "tess@example.test", organizationId: org, organizationName: "tess's team", status: "pending", role: "member" });
    expect(inv.body.assignedRoles.map((r: { id: string }) => r.id)).toEqual([DEVELOPER]);
    expect((await api(t.url, tess, "POST", url, { email: "uma@example.test", role: "member", assignedRoleIds: [] })).body).toMatchObject({
      statusCode: 409,
      message: 'User with email "uma@example.test" already invited to this organization',
    });
    expect((await api(t.url, tess, "POST", url, { email: "tess@example.test", role: "member", assignedRoleIds: [] })).status).toBe(409);
    expect((await api(t.url, tess, "GET", url)).body.map((i: { id: string }) => i.id)).toEqual([inv.body.id]);
    expect((await api(t.url, uma, "GET", "/organizations/invitations/count")).body).toBe(1);
    expect((await api(t.url, uma, "GET", "/organizations/invitations")).body.map((i: { id: string }) => i.id)).toEqual([inv.body.id]);
    const upd = await api(t.url, tess, "PUT", `${url}/${inv.body.id}`, { role: "owner", assignedRoleIds: [SANDBOXES_ADMIN] });
    expect(upd.body).toMatchObject({ role: "owner", assignedRoles: [expect.objectContaining({ id: SANDBOXES_ADMIN })] });
    // Someone else's invitation does not exist for them.
    const vic = await jwt("vic");
    expect((await api(t.url, vic, "POST", `/organizations/invitations/${inv.body.id}/accept`)).body).toMatchObject({ statusCode: 404, message: `Organization invitation with ID ${inv.body.id} not found` });
    // Accepting or declining is the person's act, as in the reference: a key of theirs is refused.
    const personal = (await api(t.url, uma, "GET", "/organizations")).body[0].id as string;
    const umaKey = await api(t.url, uma, "POST", "/api-keys", { name: "uma-key", permissions: ["write:sandboxes"] }, { "x-daytona-organization-id": personal });
    expect(umaKey.status).toBe(201);
    for (const act of ["accept", "decline"]) expect((await api(t.url, umaKey.body.value, "POST", `/organizations/invitations/${inv.body.id}/${act}`)).status).toBe(401);
    const accepted = await api(t.url, uma, "POST", `/organizations/invitations/${inv.body.id}/accept`);
    expect(accepted.body).toMatchObject({ status: "accepted", role: "owner" });
    expect((await api(t.url, uma, "GET", `/organizations/${org}/users`)).body.find((m: { userId: string }) => m.userId === "uma")).toMatchObject({
      role: "owner",
      email: "uma@example.test",
      assignedRoles: [expect.objectContaining({ id: SANDBOXES_ADMIN })],
    });
    expect((await api(t.url, uma, "POST", `/organizations/invitations/${inv.body.id}/accept`)).body.message).toBe(`Invitation with ID ${inv.body.id} is already accepted`);
    expect((await api(t.url, tess, "POST", `${url}/${inv.body.id}/cancel`)).status).toBe(403);

    // Declined, cancelled, expired; an unverified address cannot accept.
    const wes = await jwt("wes");
    await api(t.url, wes, "GET", "/organizations");
    const d = (await api(t.url, tess, "POST", url, { email: "wes@example.test", role: "member", assignedRoleIds: [] })).body;
    expect((await api(t.url, wes, "POST", `/organizations/invitations/${d.id}/decline`)).status).toBe(200);
    expect((await api(t.url, wes, "GET", "/organizations/invitations/count")).body).toBe(0);
    const c = (await api(t.url, tess, "POST", url, { email: "wes@example.test", role: "member", assignedRoleIds: [] })).body;
    expect((await api(t.url, tess, "POST", `${url}/${c.id}/cancel`)).status).toBe(204);
    expect((await api(t.url, wes, "POST", `/organizations/invitations/${c.id}/accept`)).body.message).toBe(`Invitation with ID ${c.id} is already cancelled`);
    const soon = (await api(t.url, tess, "POST", url, { email: "wes@example.test", role: "member", assignedRoleIds: [], expiresAt: new Date(Date.now() + 3000).toISOString() })).body;
    expect((await api(t.url, wes, "GET", "/organizations/invitations/count")).body).toBe(1);
    await eventually("the invitation to expire", async () => (await api(t.url, wes, "GET", "/organizations/invitations/count")).body === 0);
    expect((await api(t.url, wes, "POST", `/organizations/invitations/${soon.id}/accept`)).body).toMatchObject({ statusCode: 403, message: `Invitation with ID ${soon.id} is expired` });
    expect((await api(t.url, tess, "POST", url, { email: "wes@example.test", role: "member", assignedRoleIds: [], expiresAt: "2001-01-01T00:00:00Z" })).status).toBe(400);
    const xia = await jwt("xia", false);
    await api(t.url, xia, "GET", "/organizations");
    const x = (await api(t.url, tess, "POST", url, { email: "xia@example.test", role: "member", assignedRoleIds: [] })).body;
    expect((await api(t.url, xia, "POST", `/organizations/invitations/${x.id}/accept`)).body).toMatchObject({ statusCode: 403, message: "Please verify your email address" });
  });

  it("refuses invitations into a personal organization, and answers 404 for another organization's invitations, roles and members", async () => {
    const yan = await jwt("yan");
    const personal = (await api(t.url, yan, "GET", "/organizations")).body[0].id;
    expect((await api(t.url, yan, "POST", `/organizations/${personal}/invitations`, { email: "a@example.test", role: "member", assignedRoleIds: [] })).body).toMatchObject({
      statusCode: 403,
      message: "Cannot invite users to personal organization",
    });
    const { org } = await team("zed");
    const zed = await jwt("zed");
    const inv = (await api(t.url, zed, "POST", `/organizations/${org}/invitations`, { email: "a@example.test", role: "member", assignedRoleIds: [] })).body;
    const role = (await api(t.url, zed, "POST", `/organizations/${org}/roles`, { name: "r", description: "r", permissions: ["read:volumes"] })).body;
    // yan names zed's organization: it does not exist for yan.
    for (const [verb, path, body] of [
      ["GET", `/organizations/${org}/invitations`],
      ["PUT", `/organizations/${org}/invitations/${inv.id}`, { role: "member", assignedRoleIds: [] }],
      ["POST", `/organizations/${org}/invitations/${inv.id}/cancel`],
      ["GET", `/organizations/${org}/roles`],
      ["DELETE", `/organizations/${org}/roles/${role.id}`],
      ["GET", `/organizations/${org}/users`],
      ["DELETE", `/organizations/${org}/users/zed`],
    ] as Array<[string, string, unknown?]>) {
      expect((await api(t.url, yan, verb, path, body)).status, `${verb} ${path}`).toBe(404);
    }
    // And through yan's own organization, zed's ids are unknown there.
    expect((await api(t.url, yan, "PUT", `/organizations/${personal}/invitations/${inv.id}`, { role: "member", assignedRoleIds: [] })).status).toBe(404);
    expect((await api(t.url, yan, "PUT", `/organizations/${personal}/roles/${role.id}`, { name: "r", description: "r", permissions: ["read:volumes"] })).status).toBe(404);
    expect((await api(t.url, yan, "POST", `/organizations/${personal}/users/zed/role`, { role: "member" })).status).toBe(404);
  });
});
