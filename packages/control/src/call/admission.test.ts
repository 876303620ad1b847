import { filesIn, httpBindingsOf } from "@sandbar/protocol";
import { describe, expect, it } from "vitest";

describe("admission before the body", () => {
  // The REST adapter admits a request with a body on its path and query alone (the caller is
  // checked before the body is read), and the chain does not authorize it again once the body is
  // in. That is sound only while no route takes the organization it acts in from its body.
  it("finds every request's organization in the path or query of its REST routes", async () => {
    const services = (await filesIn("sandbar/control/v1")).flatMap((f) => f.services);
    const fromBody: string[] = [];
    let withBody = 0;
    for (const method of services.flatMap((s) => s.methods)) {
      if (!method.input.fields.some((f) => f.name === "organization_id")) continue;
      for (const b of httpBindingsOf(method)) {
        if (!b.body) continue;
        withBody++;
        if (!b.path.includes("{organization_id}")) fromBody.push(`${b.verb} ${b.path}`);
      }
    }
    expect(fromBody).toEqual([]);
    expect(withBody).toBeGreaterThan(10);
  });
});
