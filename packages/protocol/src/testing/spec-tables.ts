// The spec's endpoint tables (/work/shared/spec/api-spec.md sections 4.1-4.11) and scope table
// (section 5), as data for the contract tests.

export type HttpMethod = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";

/** One spec table row: method, path (spec spelling), success status. */
export type SpecRow = readonly [HttpMethod, string, number];

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
export const toolboxSuffixRows: SpecRow[] = [
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

export const controlRows: SpecRow[] = [
  ...configAndApiKeyRows,
  ...organizationRows,
  ...userRows,
  ...sandboxRows,
  ...resourceRows,
  ...aliasRows,
];

export const toolboxRows: SpecRow[] = [
  ...toolboxSuffixRows.map(([m, p, s]): SpecRow => [m, `/toolbox/{sandboxId}/toolbox${p}`, s]),
  ...toolboxSuffixRows.map(([m, p, s]): SpecRow => [m, `/toolbox/{workspaceId}/toolbox${p}`, s]),
];

// The spec's scope table (section 5), by the first path segment of a route.
// Reads need a scope only where the table has one (volumes, runners).
const scopeTable: Record<string, { write: string; delete: string; read?: string }> = {
  sandbox: { write: "write:sandboxes", delete: "delete:sandboxes" },
  workspace: { write: "write:sandboxes", delete: "delete:sandboxes" },
  // Sandbar: pools start sandboxes, so they take the sandboxes' scopes.
  "warm-pools": { write: "write:sandboxes", delete: "delete:sandboxes" },
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
  // The key signs URLs that read and write the sandbox's files: the toolbox's scope.
  ["GET /sandbox/{}/signing-key", "write:sandboxes"],
]);

/** Scope a route must carry per the scope table; undefined: not decided by the table. */
export function expectedScope(method: HttpMethod, path: string): string | undefined {
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

/** `{anything}` becomes `{}`: path templates compare by shape. */
export function shape(path: string): string {
  return path.replace(/\{[^}]*\}/g, "{}");
}
