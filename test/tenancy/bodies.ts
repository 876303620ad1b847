/**
 * Ids carried in request bodies rather than paths (a role assigned, a region chosen). Every such
 * field of the contract must appear here, either as a request that puts B's id in it or with the
 * reason it does not name another organization's resource: `bodyIdFields` lists the contract's
 * fields and the suite fails on one missing here.
 */
import type { DescMessage, DescService } from "@bufbuild/protobuf";
import { httpBindingsOf } from "@sandbar/protocol";
import { paramsOf } from "./ids.ts";
import type { World } from "./world.ts";

interface BodyCase {
  verb: string;
  path: string;
  body: unknown;
}

type Build = (w: World, org: string, value: string) => BodyCase;

/** `Service.Method field.path` → a request with `value` in that field; B's and nobody's ids are tried. */
export const BODY_CASES: Record<string, { theirs: (w: World) => string; build: Build }> = {
  "OrganizationService.CreateOrganization default_region_id": {
    theirs: (w) => w.B.region,
    build: (_w, _org, v) => ({ verb: "POST", path: "/organizations", body: { name: "never made", defaultRegionId: v } }),
  },
  "OrganizationService.SetDefaultRegion default_region_id": {
    theirs: (w) => w.B.region,
    // Set once per organization: alice's personal one has none yet (the others' callers get its 404).
    build: (w, _org, v) => ({ verb: "PATCH", path: `/organizations/${w.A.personal}/default-region`, body: { defaultRegionId: v } }),
  },
  "OrganizationService.SetOtelConfig config.organization_id": {
    // Output only: whatever it says, the config set is the path's organization's (B's rows are compared after).
    theirs: (w) => w.B.org,
    build: (_w, org, v) => ({ verb: "PUT", path: `/organizations/${org}/otel-config`, body: { endpoint: "https://otel.a.example.test", organizationId: v } }),
  },
  "OrganizationInvitationService.CreateInvitation assigned_role_ids": {
    theirs: (w) => w.B.role,
    build: (_w, org, v) => ({ verb: "POST", path: `/organizations/${org}/invitations`, body: { email: "gina@example.test", role: "member", assignedRoleIds: [v] } }),
  },
  "OrganizationInvitationService.UpdateInvitation assigned_role_ids": {
    theirs: (w) => w.B.role,
    build: (w, org, v) => ({ verb: "PUT", path: `/organizations/${org}/invitations/${w.A.invitation}`, body: { role: "member", assignedRoleIds: [v] } }),
  },
  "OrganizationMemberService.UpdateMemberAccess assigned_role_ids": {
    theirs: (w) => w.B.role,
    build: (_w, org, v) => ({ verb: "POST", path: `/organizations/${org}/users/erin/access`, body: { role: "member", assignedRoleIds: [v] } }),
  },
  "OrganizationMemberService.UpdateAssignedRoles assigned_role_ids": {
    theirs: (w) => w.B.role,
    build: (_w, org, v) => ({ verb: "POST", path: `/organizations/${org}/users/erin/assigned-roles`, body: { assignedRoleIds: [v] } }),
  },
  "SandboxService.CreateSandbox target": {
    theirs: (w) => w.B.region,
    build: (_w, _org, v) => ({ verb: "POST", path: "/sandbox", body: { target: v, autoStopInterval: 0 } }),
  },
  "SandboxService.CreateSandbox volumes[].volume_id": {
    theirs: (w) => w.B.volume,
    build: (_w, _org, v) => ({ verb: "POST", path: "/sandbox", body: { volumes: [{ volumeId: v, mountPath: "/mnt/v" }], autoStopInterval: 0 } }),
  },
  "SnapshotService.CreateSnapshot region_id": {
    theirs: (w) => w.B.region,
    build: (_w, _org, v) => ({ verb: "POST", path: "/snapshots", body: { name: "a-snap", imageName: "debian:12", regionId: v } }),
  },
  "WarmPoolService.CreateWarmPool target": {
    theirs: (w) => w.B.region,
    build: (_w, _org, v) => ({ verb: "POST", path: "/warm-pools", body: { snapshot: "sandbar-default", pool: 0, target: v } }),
  },
  "RunnerService.CreateRunner region_id": {
    theirs: (w) => w.B.region,
    build: (_w, _org, v) => ({ verb: "POST", path: "/runners", body: { name: "a-runner", regionId: v } }),
  },
  "DockerRegistryService.GetRegistryPushAccess region_id": {
    theirs: (w) => w.B.region,
    build: (_w, _org, v) => ({ verb: "GET", path: `/docker-registry/registry-push-access?regionId=${encodeURIComponent(v)}`, body: undefined }),
  },
};

/**
 * Otherwise valid requests for routes that check their body before looking their ids up (a
 * 400 both ways would prove nothing): `Service.Method` → the request in its JSON form. The
 * sweep fails on a 400 for both B's ids and ids of nobody, naming the route to add here.
 */
export const SAMPLE_REQUESTS: Record<string, Record<string, unknown>> = {
  "OrganizationInvitationService.UpdateInvitation": { role: "member", assignedRoleIds: [] },
  "OrganizationRoleService.UpdateRole": { name: "renamed", description: "renamed", permissions: ["read:volumes"] },
  "OrganizationMemberService.UpdateMemberAccess": { role: "member", assignedRoleIds: [] },
  "OrganizationMemberService.UpdateMemberRole": { role: "member" },
  "DockerRegistryService.UpdateRegistry": { name: "renamed", url: "registry.a.example.test", username: "a-robot" },
  "SandboxService.CreateSandboxSnapshot": { name: "a-snapshot-of-theirs" },
};

/** Fields that look like ids but do not name another organization's resource, and why. */
export const NOT_FOREIGN: Record<string, string> = {
  "SandboxService.ListSandboxes id": "a filter: the list suite checks B's sandbox never shows",
  "SandboxService.ListSandboxes region_ids": "a filter: the list suite checks B's sandbox never shows",
  "SandboxService.ListSandboxesPaginated id": "a filter: the list suite checks B's sandbox never shows",
  "SandboxService.ListSandboxesPaginated region_ids": "a filter: the list suite checks B's sandbox never shows",
  "RunnerService.ListRunners region_id": "a filter over the caller's own runners; another organization's region is 404 (runners/runners-api.test.ts)",
  "RunnerService.CreateRunner region": "the region's name (/nodes), looked up among the caller's own regions only",
  "UserService.CreateUser id": "an operator names the new user",
  "UserService.CreateUser personal_organization_default_region_id": "operator only: a system admin acts on any organization",
  "UserService.LinkAccount user_id": "the person's id at the identity provider, not a user of ours",
  "AuditService.ListAuditLogs actor_id": "a filter over the caller's organization's log: the list suite checks B's entries never show",
  "AuditService.ListAuditLogs target_id": "a filter over the caller's organization's log: the list suite checks B's entries never show",
  "AuditService.ListAllAuditLogs organization_id": "operator only: a system admin reads every organization's log",
  "AuditService.ListAllAuditLogs actor_id": "operator only: a system admin reads every organization's log",
  "AuditService.ListAllAuditLogs target_id": "operator only: a system admin reads every organization's log",
};

/** The contract's request fields that look like ids, outside the path: `Service.Method field.path`. */
export function bodyIdFields(services: DescService[]): string[] {
  const out: string[] = [];
  const walk = (key: string, msg: DescMessage, prefix: string, skip: Set<string>, depth: number) => {
    for (const f of msg.fields) {
      if (skip.has(f.name)) continue;
      const path = prefix + f.name;
      if (/^(id|target|region)$|_ids?$/.test(f.name)) out.push(`${key} ${path}`);
      const child = f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message") || (f.fieldKind === "map" && f.mapKind === "message") ? f.message : undefined;
      if (child && depth < 3 && !child.typeName.startsWith("google.")) walk(key, child, `${path}${f.fieldKind === "message" ? "." : "[]."}`, new Set(), depth + 1);
    }
  };
  for (const s of services) {
    for (const m of s.methods) walk(`${s.name}.${m.name}`, m.input, "", new Set(httpBindingsOf(m).flatMap((b) => paramsOf(b.path))), 0);
  }
  return out;
}
