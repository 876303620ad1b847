// Conformance of the protobuf contract with the spec's endpoint tables
// (/work/shared/spec/api-spec.md sections 4.1-4.11): the REST gateway is built
// from these annotations, so a missing or wrong rule here is a missing or
// wrong REST route. Enum spellings, audit declarations and the runner's
// protocol are in contract-declarations.test.ts.

import { getOption, hasOption } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { http } from "@sandbar/protocol/gen/google/api/annotations_pb.js";
import { Auth, route } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";
import { controlRows, expectedScope, shape, toolboxRows, toolboxSuffixRows } from "./testing/spec-tables.ts";
import { type Binding, agentBindings, bindingsOf, controlBindings, controlServices, label, servedBy, statusOf, variables } from "./testing/contract.ts";

describe("control contract: every RPC is a REST route", () => {
  it("finds the control services", () => {
    const names = controlServices.map((s) => s.name);
    for (const expected of [
      "ConfigService",
      "ApiKeyService",
      "OrganizationService",
      "OrganizationInvitationService",
      "OrganizationRoleService",
      "OrganizationMemberService",
      "UserService",
      "RegionService",
      "SandboxService",
      "PreviewService",
      "SnapshotService",
      "VolumeService",
      "DockerRegistryService",
      "ObjectStorageService",
      "RunnerService",
      "AuditService",
      "WarmPoolService",
    ]) {
      expect(names).toContain(expected);
    }
  });

  it("gives every method of sandbar.control.v1 a google.api.http rule", () => {
    const missing = controlServices.flatMap((s) => s.methods.filter((m) => !hasOption(m, http)).map((m) => `${s.name}.${m.name}`));
    expect(missing).toEqual([]);
    for (const s of controlServices) {
      for (const m of s.methods) expect(bindingsOf(m, getOption(m, http)).length, `${s.name}.${m.name}`).toBeGreaterThan(0);
    }
  });

  it("never binds the same method and path shape twice", () => {
    const seen = new Map<string, Binding>();
    const clashes: string[] = [];
    for (const b of controlBindings) {
      const key = `${b.method} ${shape(b.path)}`;
      const other = seen.get(key);
      if (other) clashes.push(`${label(b)} clashes with ${label(other)}`);
      seen.set(key, b);
    }
    expect(clashes).toEqual([]);
  });

  it("binds path variables, body and response_body to fields that exist", () => {
    const problems: string[] = [];
    for (const b of controlBindings) {
      const input = new Set(b.rpc.input.fields.map((f) => f.name));
      const output = new Set(b.rpc.output.fields.map((f) => f.name));
      for (const v of variables(b.path)) if (!input.has(v)) problems.push(`${label(b)}: no input field ${v}`);
      if (b.body !== "" && b.body !== "*" && !input.has(b.body)) problems.push(`${label(b)}: no body field ${b.body}`);
      if ((b.method === "GET" || b.method === "DELETE") && b.body !== "") problems.push(`${label(b)}: body on ${b.method}`);
      if (b.responseBody !== "" && !output.has(b.responseBody)) problems.push(`${label(b)}: no response field ${b.responseBody}`);
      if (b.rpc.methodKind === "server_streaming" && b.responseBody === "") problems.push(`${label(b)}: stream without response_body`);
    }
    expect(problems).toEqual([]);
  });
});

describe("control contract: the spec's endpoint rows", () => {
  it.each(controlRows)("%s %s is served by exactly one rule, with status %i", (method, path, status) => {
    const matches = servedBy(controlBindings, method, path);
    expect(matches.map(label)).toHaveLength(1);
    expect(statusOf(matches[0]!.rpc)).toBe(status);
  });

  it("leaves the toolbox to the agent's services: no control route under /toolbox", () => {
    expect(controlBindings.filter((b) => b.path.startsWith("/toolbox")).map(label)).toEqual([]);
  });

  it.each(toolboxSuffixRows)("toolbox %s %s is served by exactly one agent rule, with status %i", (method, suffix, status) => {
    const matches = servedBy(agentBindings, method, suffix);
    expect(matches.map(label)).toHaveLength(1);
    expect(statusOf(matches[0]!.rpc)).toBe(status);
  });
});

describe("control contract: scopes follow the spec's scope table", () => {
  it.each([...controlRows, ...toolboxRows])("%s %s", (method, path) => {
    const want = expectedScope(method, path);
    if (want === undefined) return;
    const isToolbox = path.startsWith("/toolbox/");
    const bindings = isToolbox ? agentBindings : controlBindings;
    const target = isToolbox ? path.replace(/^\/toolbox\/\{[^}]*\}\/toolbox/, "") : path;
    const [match] = servedBy(bindings, method, target);
    expect(match, `${method} ${path} has no rule`).toBeDefined();
    expect(getOption(match!.rpc, route).scope).toBe(want);
  });

  it("holds for every control route, the ones beyond the spec tables included", () => {
    const wrong: string[] = [];
    for (const b of controlBindings) {
      const want = expectedScope(b.method, b.path);
      const got = getOption(b.rpc, route).scope;
      if (want !== undefined && got !== want) wrong.push(`${label(b)}: scope "${got}", table says "${want}"`);
    }
    expect(wrong).toEqual([]);
  });

  it("leaves the push-access routes to the service (any of two scopes)", () => {
    for (const path of ["/docker-registry/registry-push-access", "/object-storage/push-access"]) {
      const [match] = servedBy(controlBindings, "GET", path);
      expect(getOption(match!.rpc, route).scope).toBe("");
    }
  });
});

describe("control contract: credentials", () => {
  it("needs no credentials only where nothing private can leak", () => {
    const open = controlBindings.filter((b) => getOption(b.rpc, route).auth === Auth.PUBLIC).map((b) => `${b.method} ${shape(b.path)}`);
    expect(open.sort()).toEqual(
      [
        "GET /config",
        "GET /shared-regions",
        "GET /preview/{}/public",
        "GET /preview/{}/validate/{}",
        "GET /organizations/sandbox-identity/by-sandbox-auth-token/{}",
      ].sort(),
    );
  });

  it("keeps operator routes for system admins", () => {
    for (const [method, path] of [
      ["PATCH", "/organizations/{id}/quota"],
      ["POST", "/organizations/{id}/suspend"],
      ["POST", "/organizations/{id}/unsuspend"],
      ["POST", "/users"],
      ["GET", "/users"],
      ["GET", "/users/{id}"],
      ["POST", "/users/{id}/regenerate-key-pair"],
      ["DELETE", "/users/{id}"],
      ["DELETE", "/admin/users/{id}"],
      ["PATCH", "/snapshots/{id}/general"],
      ["GET", "/organizations/otel-config/by-sandbox-auth-token/{t}"],
    ] as const) {
      const [match] = servedBy(controlBindings, method, path);
      expect(match, `${method} ${path}`).toBeDefined();
      expect(getOption(match!.rpc, route).auth, `${method} ${path}`).toBe(Auth.SYSTEM_ADMIN);
    }
  });
});

