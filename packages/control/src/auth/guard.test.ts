import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Auth, routeOf, servicesIn } from "@sandbar/protocol";
import { Organization } from "../db/entities.ts";
import { RouteTable, type RestRoute } from "../gateway/route-table.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";

// Every route of the contract, driven over REST: credentials and scopes are enforced on
// all of them (an unimplemented one would answer 501 only once past the guard).

let t: TestServer;
let orgId: string;
let routes: RestRoute[];
const keys: Record<string, string> = {};

beforeAll(async () => {
  t = await startTestServer();
  orgId = (await t.server.orm.em.fork().findOneOrFail(Organization, { createdBy: "sandbar-admin" })).id;
  routes = new RouteTable([{ services: await servicesIn("sandbar/control/v1") }]).routes;
  const scopes = [...new Set(routes.map((r) => routeOf(r.method).scope).filter(Boolean))];
  for (const scope of ["", ...scopes]) {
    const res = await api(t.url, t.adminKey, "POST", "/api-keys", { name: `scope-${scope || "none"}`, permissions: scope ? [scope] : [] });
    expect(res.status).toBe(201);
    keys[scope] = res.body.value;
  }
});
afterAll(() => t?.stop());

function concrete(route: RestRoute): string {
  return "/" + route.segments.map((s) => ("literal" in s ? s.literal : s.param === "organization_id" ? orgId : "x")).join("/");
}

async function hit(route: RestRoute, key: string | undefined) {
  return api(t.url, key, route.verb, concrete(route), route.body ? {} : undefined);
}

describe("every route", () => {
  it("has been found", () => {
    expect(routes.length).toBeGreaterThan(100);
  });

  it("refuses missing credentials with 401 unless public", async () => {
    for (const route of routes) {
      const res = await hit(route, undefined);
      const expected = routeOf(route.method).auth === Auth.PUBLIC ? [200, 400, 404, 501] : [401];
      expect(expected, `${route.verb} ${route.template} -> ${res.status}`).toContain(res.status);
    }
  });

  it("refuses a key without the route's scope with 403, and lets one with it through", async () => {
    let checked = 0;
    for (const route of routes) {
      const { scope, auth } = routeOf(route.method);
      if (!scope || auth !== Auth.UNSPECIFIED) continue;
      const denied = await hit(route, keys[""]);
      expect(denied.status, `${route.verb} ${route.template} without ${scope}`).toBe(403);
      expect(denied.body.message).toBe("Access denied");
      const other = Object.keys(keys).find((s) => s && s !== scope)!;
      expect((await hit(route, keys[other])).status, `${route.verb} ${route.template} with ${other}`).toBe(403);
      const allowed = await hit(route, keys[scope]);
      expect(allowed.status, `${route.verb} ${route.template} with ${scope}`).not.toBe(403);
      expect(allowed.status).not.toBe(401);
      checked++;
    }
    expect(checked).toBeGreaterThan(20);
  });

  it("refuses operator routes to keys that are not a full-scope system admin's", async () => {
    for (const route of routes.filter((r) => routeOf(r.method).auth === Auth.SYSTEM_ADMIN)) {
      expect((await hit(route, keys["write:sandboxes"])).status, `${route.verb} ${route.template}`).toBe(403);
    }
  });

  it("has an implementation behind every read (none answers 501)", async () => {
    // Reads only: a write with an empty body and the admin's organization could change it.
    for (const route of routes.filter((r) => r.verb === "GET")) {
      const res = await hit(route, t.adminKey);
      expect(res.status, `${route.verb} ${route.template}: ${JSON.stringify(res.body)}`).not.toBe(501);
    }
  });
});
