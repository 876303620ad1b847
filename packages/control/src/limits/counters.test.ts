/** Which counter each method of the contract counts against: declared once per RPC, read by the guard. */
import { Auth, filesIn, httpBindingsOf, routeOf } from "@sandbar/protocol";
import { describe, expect, it } from "vitest";
import { RateLimits } from "./rate-limits.ts";
import { loadRateLimitSettings } from "./settings.ts";
import { memoryStore } from "./store.ts";

const limits = new RateLimits(loadRateLimitSettings({}), memoryStore(), { shared: false, log: () => {} });

describe("the contract's rate-limit counters", () => {
  it("creation and lifecycle routes (and their /workspace forms) have their own; /config and /shared-regions none; public routes the anonymous one", async () => {
    const byRoute = new Map<string, string>();
    for (const file of await filesIn("sandbar/control/v1")) {
      for (const service of file.services) {
        for (const method of service.methods) {
          const counter = limits.counterOf(routeOf(method)) ?? "none";
          if (routeOf(method).auth === Auth.PUBLIC && counter !== "none") expect(counter).toBe("anonymous");
          for (const b of httpBindingsOf(method)) byRoute.set(`${b.verb} ${b.path}`, counter);
        }
      }
    }
    const expected: Record<string, string> = {
      "POST /sandbox": "sandbox-create",
      "POST /workspace": "sandbox-create",
      "POST /sandbox/{sandbox_id}/start": "sandbox-lifecycle",
      "POST /workspace/{sandbox_id}/start": "sandbox-lifecycle",
      "POST /sandbox/{sandbox_id}/stop": "sandbox-lifecycle",
      "POST /workspace/{sandbox_id}/stop": "sandbox-lifecycle",
      "DELETE /sandbox/{sandbox_id}": "sandbox-lifecycle",
      "DELETE /workspace/{sandbox_id}": "sandbox-lifecycle",
      "POST /sandbox/{sandbox_id}/archive": "sandbox-lifecycle",
      "POST /workspace/{sandbox_id}/archive": "sandbox-lifecycle",
      "POST /sandbox/{sandbox_id}/resize": "sandbox-lifecycle",
      "POST /workspace/{sandbox_id}/resize": "sandbox-lifecycle",
      // Stateful sandboxes: a fork is a create (of one or several), the rest lifecycle.
      "POST /sandbox/{sandbox_id}/fork": "sandbox-create",
      "POST /sandbox/{sandbox_id}/forks": "sandbox-create",
      "POST /sandbox/{sandbox_id}/pause": "sandbox-lifecycle",
      "POST /sandbox/{sandbox_id}/recover": "sandbox-lifecycle",
      "POST /sandbox/{sandbox_id}/snapshot": "sandbox-lifecycle",
      "GET /config": "none",
      "GET /shared-regions": "none",
      "GET /organizations/sandbox-identity/by-sandbox-auth-token/{auth_token}": "anonymous",
      "GET /sandbox": "authenticated",
      "GET /sandbox/{sandbox_id}": "authenticated",
      "POST /sandbox/{sandbox_id}/backup": "authenticated",
      "GET /api-keys/current": "authenticated",
    };
    for (const [route, counter] of Object.entries(expected)) expect([route, byRoute.get(route)]).toEqual([route, counter]);
    // Nothing else is exempt, and only the sandbox routes above use the sandbox counters.
    const special = [...byRoute].filter(([, c]) => c !== "authenticated" && c !== "anonymous").map(([r]) => r).sort();
    expect(special).toEqual(Object.entries(expected).filter(([, c]) => c !== "authenticated" && c !== "anonymous").map(([r]) => r).sort());
  });

});
