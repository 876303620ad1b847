// What the contract declares beyond routes: enum wire values as the reference spells them, the
// audit action of every state-changing call (and no secret in an entry), the runner's protocol.

import { getOption, hasOption } from "@bufbuild/protobuf";
import type { DescEnum, DescMethod } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { http } from "@sandbar/protocol/gen/google/api/annotations_pb.js";
import { json, route } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";

import { agentFiles, controlFiles, controlServices, runnerFiles, servicesOf } from "./testing/contract.ts";

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
  // The reference's target types (account digest section 8), and ours for what it has not (webhook endpoints, warm pools).
  const targetTypes = new Set([
    "api_key", "organization", "organization_invitation", "organization_role", "organization_user", "docker_registry",
    "runner", "sandbox", "snapshot", "user", "volume", "region", "webhook_endpoint", "warm_pool",
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
