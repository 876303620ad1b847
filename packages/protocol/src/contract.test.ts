// Conformance of the protobuf contract with the spec's endpoint tables
// (/work/shared/spec/api-spec.md sections 4.1-4.11): the REST gateway is built
// from these annotations, so a missing or wrong rule here is a missing or
// wrong REST route.
import { readdirSync } from "node:fs";
import { getOption, hasOption } from "@bufbuild/protobuf";
import type { DescEnum, DescFile, DescMethod, DescService } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { http } from "@sandbar/protocol/gen/google/api/annotations_pb.js";
import type { HttpRule } from "@sandbar/protocol/gen/google/api/http_pb.js";
import { Auth, json, route } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";

type HttpMethod = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";

/** One spec table row: method, path (spec spelling), success status. */
type SpecRow = readonly [HttpMethod, string, number];

// ---------------------------------------------------------------- spec data

const configAndApiKeyRows: SpecRow[] = [
  // 4.1
  ["GET", "/config", 200],
  // 4.2
  ["GET", "/api-keys", 200],
  ["POST", "/api-keys", 201],
  ["GET", "/api-keys/current", 200],
  ["GET", "/api-keys/{name}", 200],
  ["DELETE", "/api-keys/{name}", 204],
  ["DELETE", "/api-keys/{userId}/{name}", 204],
];

// 4.3. Where the reference's real status differs (accept/decline/leave/
// suspend/unsuspend/cancel/access send 201, deletes of organizations, roles
// and members send 200, quota sends 204) our routes follow the spec.
const organizationRows: SpecRow[] = [
  ["GET", "/organizations/invitations", 200],
  ["GET", "/organizations/invitations/count", 200],
  ["POST", "/organizations/invitations/{invitationId}/accept", 200],
  ["POST", "/organizations/invitations/{invitationId}/decline", 200],
  ["GET", "/organizations", 200],
  ["POST", "/organizations", 201],
  ["GET", "/organizations/{organizationId}", 200],
  ["DELETE", "/organizations/{organizationId}", 204],
  ["PATCH", "/organizations/{organizationId}/default-region", 204],
  ["GET", "/organizations/{organizationId}/usage", 200],
  ["PATCH", "/organizations/{organizationId}/quota", 200],
  ["GET", "/organizations/{organizationId}/available-sandbox-classes", 200],
  ["POST", "/organizations/{organizationId}/leave", 204],
  ["POST", "/organizations/{organizationId}/suspend", 204],
  ["POST", "/organizations/{organizationId}/unsuspend", 204],
  ["GET", "/organizations/otel-config/by-sandbox-auth-token/{authToken}", 200],
  ["GET", "/organizations/sandbox-identity/by-sandbox-auth-token/{authToken}", 200],
  ["GET", "/organizations/{organizationId}/otel-config", 200],
  ["PUT", "/organizations/{organizationId}/otel-config", 204],
  ["DELETE", "/organizations/{organizationId}/otel-config", 204],
  ["PUT", "/organizations/{organizationId}/experimental-config", 200],
  ["GET", "/organizations/{organizationId}/roles", 200],
  ["POST", "/organizations/{organizationId}/roles", 201],
  ["PUT", "/organizations/{organizationId}/roles/{roleId}", 200],
  ["DELETE", "/organizations/{organizationId}/roles/{roleId}", 204],
  ["GET", "/organizations/{organizationId}/users", 200],
  ["POST", "/organizations/{organizationId}/users/{userId}/access", 200],
  ["POST", "/organizations/{organizationId}/users/{userId}/role", 200],
  ["POST", "/organizations/{organizationId}/users/{userId}/assigned-roles", 200],
  ["DELETE", "/organizations/{organizationId}/users/{userId}", 204],
  ["GET", "/organizations/{organizationId}/invitations", 200],
  ["POST", "/organizations/{organizationId}/invitations", 201],
  ["PUT", "/organizations/{organizationId}/invitations/{invitationId}", 200],
  ["POST", "/organizations/{organizationId}/invitations/{invitationId}/cancel", 204],
  ["GET", "/regions", 200],
  // The spec leaves this status open; the reference sends 201.
  ["POST", "/regions", 201],
  // Reference section 3.9.
  ["GET", "/audit/organizations/{organizationId}", 200],
  ["GET", "/admin/audit", 200],
];

// 4.4 (linked-accounts: the reference sends 201 / 200).
const userRows: SpecRow[] = [
  ["GET", "/users/me", 200],
  ["POST", "/users", 201],
  ["GET", "/users", 200],
  ["GET", "/users/{id}", 200],
  ["POST", "/users/{id}/regenerate-key-pair", 201],
  ["GET", "/users/account-providers", 200],
  ["POST", "/users/linked-accounts", 204],
  ["DELETE", "/users/linked-accounts/{provider}/{providerUserId}", 204],
];

// 4.5 (backup/autostop/autoarchive: the reference sends 201).
const sandboxRows: SpecRow[] = [
  ["GET", "/sandbox", 200],
  ["POST", "/sandbox", 200],
  ["GET", "/sandbox/{sandboxId}", 200],
  ["DELETE", "/sandbox/{sandboxId}", 200],
  ["POST", "/sandbox/{sandboxId}/start", 200],
  ["POST", "/sandbox/{sandboxId}/stop", 200],
  ["PUT", "/sandbox/{sandboxId}/labels", 200],
  ["POST", "/sandbox/{sandboxId}/backup", 200],
  ["POST", "/sandbox/{sandboxId}/public/{isPublic}", 201],
  ["POST", "/sandbox/{sandboxId}/autostop/{interval}", 200],
  ["POST", "/sandbox/{sandboxId}/autoarchive/{interval}", 200],
  ["POST", "/sandbox/{sandboxId}/archive", 200],
  ["GET", "/sandbox/{sandboxId}/ports/{port}/preview-url", 200],
  ["GET", "/sandbox/{sandboxId}/build-logs", 200],
  ["GET", "/preview/{sandboxId}/public", 200],
  ["GET", "/preview/{sandboxId}/validate/{authToken}", 200],
  ["GET", "/preview/{sandboxId}/access", 200],
];

// 4.6: suffixes under /toolbox/{sandboxId}/toolbox. Served by the agent's own
// services (sandbar.agent.v1, paths without the prefix) that the control
// plane forwards by sandbox id. The session exec answers 200 or 202 at run
// time; its route status is 200.
const toolboxSuffixRows: SpecRow[] = [
  ["POST", "/files/folder", 200],
  ["POST", "/files/move", 200],
  ["POST", "/files/permissions", 200],
  ["POST", "/files/replace", 200],
  ["POST", "/files/upload", 200],
  ["POST", "/files/bulk-upload", 200],
  ["POST", "/git/add", 200],
  ["POST", "/git/branches", 200],
  ["POST", "/git/clone", 200],
  ["POST", "/git/commit", 200],
  ["GET", "/git/history", 200],
  ["POST", "/git/pull", 200],
  ["POST", "/git/push", 200],
  ["POST", "/git/checkout", 200],
  ["POST", "/process/execute", 200],
  ["POST", "/process/session", 200],
  ["POST", "/process/session/{sessionId}/exec", 200],
  ["POST", "/lsp/completions", 200],
  ["POST", "/lsp/did-close", 200],
  ["POST", "/lsp/did-open", 200],
  ["POST", "/lsp/start", 200],
  ["POST", "/lsp/stop", 200],
];

const resourceRows: SpecRow[] = [
  // 4.7
  ["POST", "/snapshots", 200],
  ["GET", "/snapshots", 200],
  ["GET", "/snapshots/{id}", 200],
  ["DELETE", "/snapshots/{id}", 200],
  ["PATCH", "/snapshots/{id}/toggle", 200],
  ["PATCH", "/snapshots/{id}/general", 200],
  ["GET", "/snapshots/{id}/build-logs", 200],
  // 4.8
  ["GET", "/volumes", 200],
  ["POST", "/volumes", 200],
  ["GET", "/volumes/{volumeId}", 200],
  ["DELETE", "/volumes/{volumeId}", 200],
  ["GET", "/volumes/by-name/{name}", 200],
  // 4.9
  ["POST", "/docker-registry", 201],
  ["GET", "/docker-registry", 200],
  ["GET", "/docker-registry/registry-push-access", 200],
  ["GET", "/docker-registry/{id}", 200],
  ["PATCH", "/docker-registry/{id}", 200],
  ["DELETE", "/docker-registry/{id}", 204],
  ["POST", "/docker-registry/{id}/set-default", 200],
  ["GET", "/object-storage/push-access", 200],
  // 4.10
  ["POST", "/runners", 201],
  ["GET", "/runners", 200],
  ["PATCH", "/runners/{id}/scheduling", 200],
];

// 4.11: the earlier names. Workspace rows mirror 4.5 with its statuses.
const aliasRows: SpecRow[] = [
  ["GET", "/workspace", 200],
  ["POST", "/workspace", 200],
  ["GET", "/workspace/{workspaceId}", 200],
  ["DELETE", "/workspace/{workspaceId}", 200],
  ["POST", "/workspace/{workspaceId}/start", 200],
  ["POST", "/workspace/{workspaceId}/stop", 200],
  ["PUT", "/workspace/{workspaceId}/labels", 200],
  ["POST", "/workspace/{workspaceId}/backup", 200],
  ["POST", "/workspace/{workspaceId}/public/{isPublic}", 201],
  ["POST", "/workspace/{workspaceId}/autostop/{interval}", 200],
  ["POST", "/workspace/{workspaceId}/autoarchive/{interval}", 200],
  ["POST", "/workspace/{workspaceId}/archive", 200],
  ["GET", "/workspace/{workspaceId}/ports/{port}/preview-url", 200],
  ["GET", "/workspace/{workspaceId}/build-logs", 200],
  ["POST", "/workspace/{workspaceId}/snapshot", 200],
  ["POST", "/workspace/{workspaceId}/resize", 201],
  // Same shapes as the sandbox preview rows: served by the same rules.
  ["GET", "/preview/{workspaceId}/public", 200],
  ["GET", "/preview/{workspaceId}/validate/{authToken}", 200],
  ["GET", "/preview/{workspaceId}/access", 200],
  ["POST", "/nodes", 201],
  ["GET", "/nodes", 200],
  ["PATCH", "/nodes/{id}/scheduling", 200],
  ["POST", "/images", 200],
  ["GET", "/images", 200],
  ["PATCH", "/images/{id}/toggle", 200],
  ["PATCH", "/images/{id}/general", 200],
  ["DELETE", "/images/{id}", 200],
];

const controlRows: SpecRow[] = [
  ...configAndApiKeyRows,
  ...organizationRows,
  ...userRows,
  ...sandboxRows,
  ...resourceRows,
  ...aliasRows,
];

const toolboxRows: SpecRow[] = [
  ...toolboxSuffixRows.map(([m, p, s]): SpecRow => [m, `/toolbox/{sandboxId}/toolbox${p}`, s]),
  ...toolboxSuffixRows.map(([m, p, s]): SpecRow => [m, `/toolbox/{workspaceId}/toolbox${p}`, s]),
];

// The spec's scope table (section 5), by the first path segment of a route.
// Reads need a scope only where the table has one (volumes, runners).
const scopeTable: Record<string, { write: string; delete: string; read?: string }> = {
  sandbox: { write: "write:sandboxes", delete: "delete:sandboxes" },
  workspace: { write: "write:sandboxes", delete: "delete:sandboxes" },
  snapshots: { write: "write:snapshots", delete: "delete:snapshots" },
  images: { write: "write:snapshots", delete: "delete:snapshots" },
  "docker-registry": { write: "write:registries", delete: "delete:registries" },
  volumes: { write: "write:volumes", delete: "delete:volumes", read: "read:volumes" },
  regions: { write: "write:regions", delete: "delete:regions" },
  audit: { write: "", delete: "", read: "read:audit_logs" },
  runners: { write: "write:runners", delete: "delete:runners", read: "read:runners" },
  nodes: { write: "write:runners", delete: "delete:runners", read: "read:runners" },
};

// Routes whose permission the Route option cannot express: the service checks it.
const scopeCheckedByService = new Set([
  // Any of write:snapshots / write:sandboxes (reference).
  "GET /docker-registry/registry-push-access",
  "GET /object-storage/push-access",
]);

// Reads stricter than the table: they hand out a way into the sandbox (the preview token opens
// every port and the toolbox's WebSockets; a signed URL opens a port), so the toolbox's scope.
const scopeStricterThanSpec = new Map([
  ["GET /sandbox/{}/ports/{}/preview-url", "write:sandboxes"],
  ["GET /workspace/{}/ports/{}/preview-url", "write:sandboxes"],
  ["GET /sandbox/{}/ports/{}/signed-preview-url", "write:sandboxes"],
]);

/** Scope a route must carry per the scope table; undefined: not decided by the table. */
function expectedScope(method: HttpMethod, path: string): string | undefined {
  const stricter = scopeStricterThanSpec.get(`${method} ${shape(path)}`);
  if (stricter !== undefined) return stricter;
  const segment = path.split("/")[1] ?? "";
  // manage:api_keys applies only when an API key manages keys: checked in the service.
  if (segment === "api-keys" || scopeCheckedByService.has(`${method} ${shape(path)}`)) return undefined;
  // The whole toolbox needs write:sandboxes, reads included (reference).
  if (segment === "toolbox") return "write:sandboxes";
  const scopes = scopeTable[segment];
  if (!scopes) return "";
  if (method === "DELETE") return scopes.delete;
  if (method === "GET") return scopes.read ?? "";
  return scopes.write;
}

// ------------------------------------------------------- contract loading

interface Binding {
  readonly method: HttpMethod;
  readonly path: string;
  readonly body: string;
  readonly responseBody: string;
  readonly rpc: DescMethod;
}

/** `{anything}` becomes `{}`: path templates compare by shape. */
function shape(path: string): string {
  return path.replace(/\{[^}]*\}/g, "{}");
}

function variables(path: string): string[] {
  return [...path.matchAll(/\{([^}=]*)/g)].map((m) => m[1] ?? "");
}

const verbs: Record<string, HttpMethod> = { get: "GET", post: "POST", put: "PUT", patch: "PATCH", delete: "DELETE" };

function bindingsOf(rpc: DescMethod, rule: HttpRule): Binding[] {
  const { pattern } = rule;
  const out: Binding[] = [];
  if (pattern.case !== undefined && pattern.case !== "custom") {
    const method = verbs[pattern.case];
    if (method) out.push({ method, path: pattern.value, body: rule.body, responseBody: rule.responseBody, rpc });
  }
  for (const extra of rule.additionalBindings) out.push(...bindingsOf(rpc, extra));
  return out;
}

function isDescFile(value: unknown): value is DescFile {
  return typeof value === "object" && value !== null && (value as { kind?: unknown }).kind === "file";
}

/** Every generated file of sandbar.<pkg>.v1, found on disk so new files are covered too. */
async function loadFiles(pkg: string): Promise<DescFile[]> {
  const dir = new URL(`../gen/sandbar/${pkg}/v1/`, import.meta.url);
  const names = readdirSync(dir).filter((n) => n.endsWith("_pb.js")).sort();
  const files: DescFile[] = [];
  for (const name of names) {
    const mod: Record<string, unknown> = await import(`@sandbar/protocol/gen/sandbar/${pkg}/v1/${name}`);
    files.push(...Object.values(mod).filter(isDescFile));
  }
  return files;
}

function servicesOf(files: DescFile[], pkg: string): DescService[] {
  return files.filter((f) => f.proto.package === pkg).flatMap((f) => f.services);
}

function bindingsOfServices(services: DescService[]): Binding[] {
  return services.flatMap((s) => s.methods.flatMap((m) => (hasOption(m, http) ? bindingsOf(m, getOption(m, http)) : [])));
}

const statusOf = (rpc: DescMethod): number => getOption(rpc, route).status || 200;
const label = (b: Binding): string => `${b.method} ${b.path} (${b.rpc.parent.name}.${b.rpc.name})`;

const controlFiles = await loadFiles("control");
const controlServices = servicesOf(controlFiles, "sandbar.control.v1");
const controlBindings = bindingsOfServices(controlServices);
const agentFiles = await loadFiles("agent");
const agentBindings = bindingsOfServices(servicesOf(agentFiles, "sandbar.agent.v1"));
const runnerFiles = await loadFiles("runner");

function servedBy(bindings: Binding[], method: HttpMethod, path: string): Binding[] {
  return bindings.filter((b) => b.method === method && shape(b.path) === shape(path));
}

// ------------------------------------------------------------------- tests

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

describe("control contract: enum wire values", () => {
  const enums = new Map<string, DescEnum>(controlFiles.flatMap((f) => f.enums.map((e): [string, DescEnum] => [e.name, e])));
  const screaming = (name: string): string => name.replace(/([a-z0-9])([A-Z])/g, "$1_$2").toUpperCase();
  const wire = (e: DescEnum): string[] =>
    e.values
      .filter((v) => v.number !== 0)
      .map((v) => getOption(v, json) || v.name.slice(screaming(e.name).length + 1).toLowerCase());

  // Exact values of the reference (daytona-api-sandbox.md section 2 and the account digest).
  const reference: Record<string, string[]> = {
    SandboxState: [
      "creating", "restoring", "destroyed", "destroying", "started", "stopped", "starting", "stopping", "error",
      "build_failed", "pending_build", "building_snapshot", "unknown", "pulling_snapshot", "archived", "archiving",
      "resizing", "snapshotting", "forking", "pausing", "paused", "resuming",
    ],
    SandboxDesiredState: ["destroyed", "started", "stopped", "resized", "archived", "paused"],
    BackupState: ["None", "Pending", "InProgress", "Completed", "Error"],
    SandboxClass: ["linux-vm", "container", "android", "windows"],
    // The research digest's two, then what the 0.218 api-client's GpuType adds.
    GpuType: ["H100", "RTX-PRO-6000", "H200", "B300", "RTX-4090", "RTX-5090", "MI355X"],
    SnapshotState: ["building", "pending", "pulling", "active", "inactive", "error", "build_failed", "removing"],
    VolumeState: ["creating", "ready", "pending_create", "pending_delete", "deleting", "deleted", "error"],
    RunnerState: ["initializing", "ready", "disabled", "decommissioned", "unresponsive"],
    RegionType: ["shared", "dedicated", "custom"],
    RegistryType: ["internal", "organization", "transient", "backup"],
    SandboxListSortField: ["name", "cpu", "memoryGib", "diskGib", "lastActivityAt", "createdAt"],
    SandboxSortField: ["id", "name", "state", "snapshot", "region", "updatedAt", "createdAt", "lastActivityAt"],
    SnapshotSortField: ["name", "state", "lastUsedAt", "createdAt"],
    SortOrder: ["asc", "desc"],
    OrganizationMemberRole: ["owner", "member"],
    InvitationStatus: ["pending", "accepted", "declined", "cancelled"],
    SystemRole: ["admin", "user"],
  };

  it.each(Object.keys(reference))("%s spells its values as the reference does", (name) => {
    const e = enums.get(name);
    expect(e, name).toBeDefined();
    expect(wire(e!)).toEqual(reference[name]);
  });
});

describe("audit: every state-changing call is declared, and no secret reaches an entry", () => {
  // The agent's methods too: toolbox calls are audited when the operator asks for it.
  const agentServices = servicesOf(agentFiles, "sandbar.agent.v1");
  const methods = [...controlServices, ...agentServices].flatMap((s) => s.methods);
  const changesState = (m: DescMethod) => {
    const rule = hasOption(m, http) ? getOption(m, http) : undefined;
    // No REST binding (an RPC-only method) counts as state-changing: nothing says it only reads.
    return !rule || rule.pattern.case !== "get";
  };
  const auditOf = (m: DescMethod) => getOption(m, route).audit;
  // The reference's target types (account digest section 8), and ours for what it has not (webhook endpoints).
  const targetTypes = new Set([
    "api_key", "organization", "organization_invitation", "organization_role", "organization_user", "docker_registry",
    "runner", "sandbox", "snapshot", "user", "volume", "region", "webhook_endpoint",
  ]);

  it("declares an action on every method whose REST binding is not a GET, and none on reads", () => {
    const missing = methods.filter((m) => changesState(m) && !auditOf(m)?.action).map((m) => `${m.parent.name}.${m.name}`);
    expect(missing).toEqual([]);
    const onReads = methods.filter((m) => !changesState(m) && auditOf(m)).map((m) => `${m.parent.name}.${m.name}`);
    expect(onReads).toEqual([]);
  });

  it("names actions and targets as the reference does, and targets by fields that exist", () => {
    const problems: string[] = [];
    for (const m of methods.filter(changesState)) {
      const a = auditOf(m);
      if (!a) continue; // reported by the test above
      const name = `${m.parent.name}.${m.name}`;
      if (!/^[a-z][a-z0-9_]*$/.test(a.action)) problems.push(`${name}: action "${a.action}" is not snake_case`);
      if (a.targetType && !targetTypes.has(a.targetType)) problems.push(`${name}: unknown target type "${a.targetType}"`);
      if (a.targetId && !m.input.fields.some((f) => f.name === a.targetId)) problems.push(`${name}: no request field ${a.targetId}`);
      if (a.targetId && !a.targetType) problems.push(`${name}: a target id without a target type`);
    }
    expect(problems).toEqual([]);
  });

  // Fields whose name says they carry a credential or a value meant to stay private.
  const SECRET_NAME = /(^|_)(password|passwords|secret|secrets|token|tokens|headers|env|envs|credentials)(_|$)|api_key|private_key|key_value/;
  // Names that match but are not secret: the audit list's own pagination cursor.
  const NOT_SECRET = new Set(["sandbar.control.v1.ListAuditLogsRequest.next_token", "sandbar.control.v1.ListAllAuditLogsRequest.next_token"]);

  it("marks every request field whose name looks secret with [debug_redact = true], at any depth", () => {
    const unmarked = new Set<string>();
    const marked = new Set<string>();
    const seen = new Set<string>();
    const walk = (desc: DescMethod["input"]) => {
      if (seen.has(desc.typeName) || desc.typeName.startsWith("google.")) return;
      seen.add(desc.typeName);
      for (const f of desc.fields) {
        const id = `${desc.typeName}.${f.name}`;
        if (SECRET_NAME.test(f.name) && !NOT_SECRET.has(id)) (f.proto.options?.debugRedact === true ? marked : unmarked).add(id);
        if (f.message) walk(f.message);
      }
    };
    for (const m of methods) walk(m.input);
    expect([...unmarked]).toEqual([]);
    // The walk reaches what it must: nested messages and the agent's requests included.
    expect([...marked]).toEqual(
      expect.arrayContaining([
        "sandbar.control.v1.OtelConfig.headers",
        "sandbar.control.v1.CreateRegistryRequest.password",
        "sandbar.control.v1.CreateRunnerRequest.api_key",
        "sandbar.control.v1.CreateSandboxRequest.env",
        "sandbar.agent.v1.CloneRequest.password",
        "sandbar.agent.v1.ExecuteRequest.envs",
      ]),
    );
  });
});

describe("runner protocol", () => {
  it("is plain gRPC: no REST rules", () => {
    const services = servicesOf(runnerFiles, "sandbar.runner.v1");
    expect(services.map((s) => s.name).sort()).toEqual(["RunnerService", "RunnerSnapshotService"]);
    const annotated = services.flatMap((s) => s.methods.filter((m) => hasOption(m, http)).map((m) => m.name));
    expect(annotated).toEqual([]);
  });

  it("streams packed layers, restores and build logs", () => {
    const methods = new Map(servicesOf(runnerFiles, "sandbar.runner.v1").flatMap((s) => s.methods.map((m): [string, DescMethod] => [m.name, m])));
    expect(methods.get("PackSandbox")?.methodKind).toBe("server_streaming");
    expect(methods.get("RestoreSandbox")?.methodKind).toBe("client_streaming");
    expect(methods.get("PullSnapshot")?.methodKind).toBe("server_streaming");
    expect(methods.get("BuildSnapshot")?.methodKind).toBe("bidi_streaming"); // the spec, then the contexts' bytes streamed by control
    expect(methods.get("GetSnapshotLogs")?.methodKind).toBe("server_streaming");
  });
});
