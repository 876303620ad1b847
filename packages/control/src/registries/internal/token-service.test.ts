import { describe, expect, it } from "vitest";
import { grantedAccess } from "./token-service.ts";

describe("grantedAccess", () => {
  const ns = "5b0c4e52-8a7c-4d1e-9b8f-0a1b2c3d4e5f";
  const grant = (actions: "pull" | "pull,push") => ({ organizationId: ns, actions, expiresAt: new Date(Date.now() + 60_000) });

  it("grants only the asked actions the account holds, only under its namespace", () => {
    expect(grantedAccess([`repository:${ns}/app:pull,push`], grant("pull,push"), ns)).toEqual([{ type: "repository", name: `${ns}/app`, actions: ["pull", "push"] }]);
    expect(grantedAccess([`repository:${ns}/a/b:push,pull`], grant("pull"), ns)).toEqual([{ type: "repository", name: `${ns}/a/b`, actions: ["pull"] }]);
    expect(grantedAccess([`repository:${ns}/app:push`], grant("pull"), ns)).toEqual([]);
    expect(grantedAccess([`repository:${ns}/app:delete,*`], grant("pull,push"), ns)).toEqual([]);
  });

  it("grants nothing outside it: other namespaces, a longer name with the same prefix, the namespace itself, the catalog", () => {
    for (const scope of ["repository:other/app:pull", `repository:${ns}x/app:pull`, `repository:${ns}:pull`, `repository:${ns}/:pull`, "registry:catalog:*", "repository:pull", ""]) {
      expect(grantedAccess([scope], grant("pull,push"), ns), scope).toEqual([]);
    }
  });
});
