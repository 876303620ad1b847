import { create } from "@bufbuild/protobuf";
import { CloneRequestSchema } from "@sandbar/protocol/gen/sandbar/agent/v1/git_pb.js";
import { SetOtelConfigRequestSchema } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { CreateSandboxRequestSchema } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { describe, expect, it } from "vitest";
import { loadSettings } from "../settings.ts";
import { requestMetadata } from "./request-metadata.ts";

// What an entry keeps of a request, on the generated request types (no server needed).

describe("request metadata", () => {
  it("drops redacted fields at any depth and keeps the rest in the REST spelling", () => {
    const otel = create(SetOtelConfigRequestSchema, { organizationId: "o", config: { endpoint: "https://e", headers: { authorization: "Bearer top-secret" } } });
    expect(requestMetadata(SetOtelConfigRequestSchema, otel)).toEqual({ organizationId: "o", config: { endpoint: "https://e" } });
    const sandbox = create(CreateSandboxRequestSchema, { name: "n", env: { TOKEN: "top-secret" }, labels: { a: "b" } });
    const json = requestMetadata(CreateSandboxRequestSchema, sandbox)!;
    expect(json).toMatchObject({ name: "n", labels: { a: "b" } });
    expect(JSON.stringify(json)).not.toContain("top-secret");
    expect(json).not.toHaveProperty("env");
  });

  it("masks credentials in URLs, cuts long strings, and replaces what PostgreSQL refuses", () => {
    const clone = create(CloneRequestSchema, { url: "https://user:top-secret@example.test/r.git", path: `/tmp/${"x".repeat(5000)}\u0000\ud800`, password: "top-secret" });
    const json = requestMetadata(CloneRequestSchema, clone) as { url: string; path: string };
    expect(json.url).toBe("https://***@example.test/r.git");
    expect(json.path).toMatch(/^\/tmp\/x+\.\.\. \(5007 characters\)$/);
    expect(json.path.length).toBeLessThan(1100);
    expect(JSON.stringify(json)).not.toContain("top-secret");
    const nul = requestMetadata(CloneRequestSchema, create(CloneRequestSchema, { url: "a\u0000b\udc00" })) as { url: string };
    expect(nul.url).toBe("a\ufffdb\ufffd");
  });

  it("keeps only the field names of a request over 64 KB", () => {
    const labels = Object.fromEntries(Array.from({ length: 200 }, (_, i) => [`label-${i}`, "v".repeat(1000)]));
    expect(requestMetadata(CreateSandboxRequestSchema, create(CreateSandboxRequestSchema, { name: "big", labels }))).toEqual({
      truncated: true,
      fields: expect.arrayContaining(["name", "labels"]),
    });
  });

  it("reads its settings strictly", () => {
    expect(loadSettings({})).toMatchObject({ auditRetentionDays: undefined, auditToolbox: false });
    expect(loadSettings({ SANDBAR_AUDIT_RETENTION_DAYS: "90", SANDBAR_AUDIT_TOOLBOX: "true" })).toMatchObject({ auditRetentionDays: 90, auditToolbox: true });
    expect(() => loadSettings({ SANDBAR_AUDIT_RETENTION_DAYS: "0" })).toThrow(/SANDBAR_AUDIT_RETENTION_DAYS/);
    expect(() => loadSettings({ SANDBAR_AUDIT_RETENTION_DAYS: "a week" })).toThrow(/SANDBAR_AUDIT_RETENTION_DAYS/);
    expect(() => loadSettings({ SANDBAR_AUDIT_TOOLBOX: "yes please" })).toThrow(/SANDBAR_AUDIT_TOOLBOX/);
  });
});
