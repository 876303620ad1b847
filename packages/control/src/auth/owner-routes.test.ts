import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { routeOf, servicesIn } from "@sandbar/protocol";
import { RouteTable, type RestRoute } from "../gateway/route-table.ts";
import { issuerSettings, TestIssuer } from "../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";
import { ALL_SCOPES } from "./scopes.ts";

// Owner-only routes and the scopes a key acts with, on a real server, people signed in with
// JWTs. No scope names the owner-only routes (members, invitations, roles, webhooks, OTel), so
// a key passes them only when it holds every scope and its creator is an owner now; and a key
// never acts beyond what its creator currently holds.

const idp = new TestIssuer();
let t: TestServer;
let ownerRoutes: RestRoute[];
let ownerMethods: string[];
const jwt = (sub: string) => idp.sign("k", { sub, email: `${sub}@example.test`, email_verified: true, name: sub });

beforeAll(async () => {
  await idp.start();
  await idp.addKey("k");
  t = await startTestServer({ settings: issuerSettings(idp) });
  const services = await servicesIn("sandbar/control/v1");
  ownerMethods = services.flatMap((s) => s.methods.filter((m) => routeOf(m).owner).map((m) => `${s.name}.${m.name}`));
  ownerRoutes = new RouteTable([{ services }]).routes.filter((r) => routeOf(r.method).owner);
});
afterAll(async () => {
  await t?.stop();
  idp.stop();
});

/** A new organization of `owner`'s (signed in), and the header that selects it. */
async function organization(owner: string, name: string) {
  const res = await api(t.url, await jwt(owner), "POST", "/organizations", { name, defaultRegionId: "local" });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return { org: res.body.id as string, h: { "x-sandbar-organization-id": res.body.id as string } };
}

/** A key made by `token` (a JWT with `h`, or a managing key). */
async function key(token: string, h: Record<string, string>, name: string, permissions: readonly string[]): Promise<string> {
  const res = await api(t.url, token, "POST", "/api-keys", { name, permissions }, h);
  expect(res.status, `${name}: ${JSON.stringify(res.body)}`).toBe(201);
  return res.body.value;
}

/** `who` joins `org` as a member holding `roleIds`, through an invitation they accept. */
async function join(ownerJwt: string, org: string, who: string, roleIds: string[]): Promise<string> {
  const member = await jwt(who);
  await api(t.url, member, "GET", "/organizations"); // the user row appears on first sign-in
  const inv = await api(t.url, ownerJwt, "POST", `/organizations/${org}/invitations`, { email: `${who}@example.test`, role: "member", assignedRoleIds: roleIds });
  expect(inv.status, JSON.stringify(inv.body)).toBe(201);
  expect((await api(t.url, member, "POST", `/organizations/invitations/${inv.body.id}/accept`)).status).toBe(200);
  return member;
}

async function role(ownerJwt: string, org: string, name: string, permissions: readonly string[]): Promise<string> {
  const res = await api(t.url, ownerJwt, "POST", `/organizations/${org}/roles`, { name, description: name, permissions });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.id;
}

/** The route with the organization's id, and ids that name nothing elsewhere (the guard answers first). */
function hit(route: RestRoute, org: string, token: string, h: Record<string, string> = {}) {
  const path = "/" + route.segments.map((s) => ("literal" in s ? s.literal : s.param === "organization_id" ? org : "00000000-0000-4000-8000-000000000000")).join("/");
  return api(t.url, token, route.verb, path, route.body ? {} : undefined, h);
}

const named = (r: RestRoute) => `${r.verb} ${r.template}`;
const DELETE_ORGANIZATION = "OrganizationService.DeleteOrganization";
const methodOf = (r: RestRoute) => `${r.method.parent.name}.${r.method.name}`;

describe("owner-only routes", () => {
  it("are found in the contract, every one on REST", () => {
    expect(ownerMethods.length).toBeGreaterThanOrEqual(20);
    expect([...new Set(ownerRoutes.map(methodOf))].sort()).toEqual([...ownerMethods].sort());
  });

  it("refuse an owner's key holding any single scope, or none, with 403 Access denied", async () => {
    const { org, h } = await organization("olive", "olive inc");
    const olive = await jwt("olive");
    const keys = await Promise.all(["", ...ALL_SCOPES].map(async (s) => [s || "(none)", await key(olive, h, `single-${s || "none"}`, s ? [s] : [])] as const));
    let refused = 0;
    for (const route of ownerRoutes) {
      const answers = await Promise.all(keys.map(async ([scope, k]) => [scope, await hit(route, org, k)] as const));
      for (const [scope, res] of answers) {
        expect(res.status, `${named(route)} with ${scope}: ${JSON.stringify(res.body)}`).toBe(403);
        expect(res.body.message).toBe("Access denied");
        refused++;
      }
    }
    expect(refused).toBe(ownerRoutes.length * (ALL_SCOPES.length + 1));
    // Nothing was changed by the refused calls: the organization is still there, with no invitation.
    expect((await api(t.url, olive, "GET", `/organizations/${org}/invitations`)).body).toEqual([]);
  });

  it("admit the owner signed in and the owner's full-scope key, and no one once the key's creator is no longer an owner", async () => {
    const { org, h } = await organization("pat", "pat inc");
    const pat = await jwt("pat");
    const full = await key(pat, h, "full", ALL_SCOPES);
    for (const [who, token, hdr] of [["jwt", pat, h], ["full-scope key", full, {}]] as const) {
      // Every owner route but deleting the organization, with ids that name nothing: past the guard.
      for (const route of ownerRoutes.filter((r) => methodOf(r) !== DELETE_ORGANIZATION)) {
        const res = await hit(route, org, token, hdr);
        expect([401, 403], `${named(route)} by ${who}: ${JSON.stringify(res.body)}`).not.toContain(res.status);
        expect(res.status, `${named(route)} by ${who}`).toBeLessThan(500);
      }
      const call = (verb: string, path: string, body?: unknown) => api(t.url, token, verb, path, body, hdr);
      const inv = await call("POST", `/organizations/${org}/invitations`, { email: `to-${who.replace(/\W/g, "")}@example.test`, role: "owner", assignedRoleIds: [] });
      expect(inv.status, JSON.stringify(inv.body)).toBe(201);
      expect(inv.body.role).toBe("owner");
      expect((await call("POST", `/organizations/${org}/invitations/${inv.body.id}/cancel`)).status).toBe(204);
      const made = await call("POST", `/organizations/${org}/roles`, { name: `keys ${who}`, description: "d", permissions: ["manage:api_keys"] });
      expect(made.status, JSON.stringify(made.body)).toBe(201);
      expect((await call("DELETE", `/organizations/${org}/roles/${made.body.id}`)).status).toBe(204);
      const hook = await call("POST", `/webhooks/organizations/${org}/endpoints`, { url: "https://hooks.pat.example.test/in", enabled: false });
      expect(hook.status, JSON.stringify(hook.body)).toBe(201);
      expect((await call("DELETE", `/webhooks/organizations/${org}/endpoints/${hook.body.endpoint.id}`)).status).toBe(204);
      expect((await call("PUT", `/organizations/${org}/otel-config`, { endpoint: "https://otel.pat.example.test", headers: {} })).status).toBe(204);
      expect((await call("DELETE", `/organizations/${org}/otel-config`)).status).toBe(204);
    }

    // Deleting an organization: by its owner's full-scope key, then by its owner signed in.
    const byKey = await organization("pat", "pat two");
    const narrow = await key(pat, byKey.h, "narrow", ALL_SCOPES.filter((s) => s !== "read:audit_logs"));
    expect((await api(t.url, narrow, "DELETE", `/organizations/${byKey.org}`)).status).toBe(403);
    expect((await api(t.url, await key(pat, byKey.h, "full", ALL_SCOPES), "DELETE", `/organizations/${byKey.org}`)).status).toBe(204);
    const byJwt = await organization("pat", "pat three");
    expect((await api(t.url, pat, "DELETE", `/organizations/${byJwt.org}`)).status).toBe(204);

    // Pat made a member holding every permission (through a role, so the key survives the change):
    // the full-scope key keeps its scopes, no longer the owner routes.
    const everything = await role(pat, org, "everything", ALL_SCOPES);
    await join(pat, org, "quinn", []);
    const quinn = await jwt("quinn");
    expect((await api(t.url, pat, "POST", `/organizations/${org}/users/quinn/role`, { role: "owner" })).status).toBe(200);
    expect((await api(t.url, quinn, "POST", `/organizations/${org}/users/pat/access`, { role: "member", assignedRoleIds: [everything] })).status).toBe(200);
    expect((await api(t.url, full, "GET", "/api-keys/current")).status).toBe(200);
    expect((await api(t.url, full, "GET", "/volumes")).status).toBe(200);
    for (const route of ownerRoutes) {
      const res = await hit(route, org, full);
      expect(res.status, `${named(route)} by a former owner's full-scope key`).toBe(403);
    }
  });
});

describe("a member's key", () => {
  it("holding every scope does not pass owner-only routes", async () => {
    const { org } = await organization("rita", "rita inc");
    const rita = await jwt("rita");
    const everything = await role(rita, org, "everything", ALL_SCOPES);
    const sam = await join(rita, org, "sam", [everything]);
    const full = await key(sam, { "x-sandbar-organization-id": org }, "sam-full", ALL_SCOPES);
    for (const route of ownerRoutes) {
      const res = await hit(route, org, full);
      expect(res.status, `${named(route)}: ${JSON.stringify(res.body)}`).toBe(403);
      expect(res.body.message).toBe("Access denied");
    }
  });

  it("loses what its creator's roles lose, on the next request: routes, managing keys and assigning scopes", async () => {
    const { org } = await organization("uma", "uma inc");
    const uma = await jwt("uma");
    // Managed keys on, so a key holding manage:api_keys may make keys.
    expect((await api(t.url, t.adminKey, "PUT", `/admin/organizations/${org}/managed-api-keys`, { enabled: true })).status).toBe(204);
    const roleBody = (permissions: string[]) => ({ name: "crew", description: "crew", permissions });
    const crew = await role(uma, org, "crew", ["manage:api_keys", "read:volumes", "write:sandboxes"]);
    const vic = await join(uma, org, "vic", [crew]);
    const k = await key(vic, { "x-sandbar-organization-id": org }, "vic-key", ["manage:api_keys", "read:volumes"]);
    expect((await api(t.url, k, "GET", "/volumes")).status).toBe(200);
    expect((await api(t.url, k, "POST", "/api-keys", { name: "child-1", permissions: ["read:volumes"] })).status).toBe(201);

    // The role no longer grants read:volumes (a role change does not delete keys): the key keeps
    // the scope on record but may not use it, nor hand it on.
    expect((await api(t.url, uma, "PUT", `/organizations/${org}/roles/${crew}`, roleBody(["manage:api_keys", "write:sandboxes"]))).status).toBe(200);
    const listed = await api(t.url, k, "GET", "/volumes");
    expect(listed.status).toBe(403);
    expect(listed.body.message).toBe("Access denied");
    expect((await api(t.url, k, "POST", "/api-keys", { name: "child-2", permissions: ["read:volumes"] })).body).toMatchObject({
      statusCode: 403,
      message: "Insufficient permissions for assigning: read:volumes",
    });
    expect((await api(t.url, k, "POST", "/api-keys", { name: "child-3", permissions: [] })).status).toBe(201);

    // Nor manage:api_keys.
    expect((await api(t.url, uma, "PUT", `/organizations/${org}/roles/${crew}`, roleBody(["write:sandboxes"]))).status).toBe(200);
    expect((await api(t.url, k, "POST", "/api-keys", { name: "child-4", permissions: [] })).body).toMatchObject({
      statusCode: 403,
      message: "This API key is not authorized to manage API keys",
    });

    // Given back: usable again at once.
    expect((await api(t.url, uma, "PUT", `/organizations/${org}/roles/${crew}`, roleBody(["read:volumes"]))).status).toBe(200);
    expect((await api(t.url, k, "GET", "/volumes")).status).toBe(200);
  });
});

describe("a system admin's key", () => {
  it("reads OpenTelemetry header values in clear only when it holds every scope (the operator's rule)", async () => {
    const [{ id: org }] = (await api(t.url, t.adminKey, "GET", "/organizations")).body as Array<{ id: string }>;
    const url = `/organizations/${org}/otel-config`;
    expect((await api(t.url, t.adminKey, "PUT", url, { endpoint: "https://otel.example.test", headers: { "x-token": "s3cret" } })).status).toBe(204);
    const narrow = await key(t.adminKey, {}, "admin-narrow", ["write:sandboxes"]);
    expect((await api(t.url, narrow, "GET", url)).body.headers).toEqual({ "x-token": "******" });
    expect((await api(t.url, t.adminKey, "GET", url)).body.headers).toEqual({ "x-token": "s3cret" });
  });
});
