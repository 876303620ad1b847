import { randomBytes, randomUUID } from "node:crypto";
import { expect } from "vitest";
import { hashApiKey, keyEnds } from "../../auth/key-material.ts";
import { execIn } from "../../db/exec.ts";
import { ApiKeyRecord, Organization, User } from "../../db/entities.ts";
import { insertOrganization } from "../../organizations/new-organization.ts";
import type { Settings } from "../../settings.ts";
import { api, startTestServer, type TestServer } from "../../testing/server.ts";
import { LocalRuntime } from "../local-runtime.ts";
import type { SandboxManager } from "../manager.ts";
import { sh } from "./agent-client.ts";
import { standInAgentBundle } from "./stand-in-agent.ts";
import type { UntypedJson } from "../../casts.ts";

// The poll helper moved to protocol so that every package's tests share it; kept importable from here.
export { eventually } from "../../../../protocol/src/testing/eventually.ts";

// One real server per test file, its sandboxes run by the stand-in agent, plus the calls the
// suites make over REST.

export interface SandboxFixture {
  t: TestServer;
  orgId: string;
  manager: SandboxManager;
  runtime: LocalRuntime;
  call(method: string, path: string, body?: unknown, key?: string): ReturnType<typeof api>;
  /** POST /sandbox, expecting 200. */
  create(body?: Record<string, unknown>): Promise<SandboxDto>;
  /** A shell command in the sandbox, through its agent. */
  exec(id: string, command: string): Promise<{ exitCode: number; result: string }>;
  /** A second organization with a full-scope key of its own. */
  otherOrganization(): Promise<{ orgId: string; key: string }>;
  stop(opts?: { keepData?: boolean }): Promise<void>;
}

export interface SandboxDto {
  id: string;
  name: string;
  state: string;
  desiredState: string;
  [key: string]: UntypedJson;
}

export async function sandboxFixture(settings: Partial<Settings> = {}, server: { dataDir?: string; adminKey?: string } = {}): Promise<SandboxFixture> {
  const agentBundle = await standInAgentBundle();
  const t = await startTestServer({ ...server, settings: { agentBundle, ...settings } });
  const em = t.server.orm.em.fork();
  const orgId = (await em.findOneOrFail(Organization, { createdBy: "sandbar-admin" })).id;
  const manager = t.server.sandboxes.manager;
  const runtime = t.server.sandboxes.runtime;
  if (!(runtime instanceof LocalRuntime)) throw new Error("the sandbox tests need the local runtime (run them as root)");
  const call = (method: string, path: string, body?: unknown, key = t.adminKey) => api(t.url, key, method, path, body);
  return {
    t,
    orgId,
    manager,
    runtime,
    call,
    async create(body = {}) {
      const res = await call("POST", "/sandbox", body);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      return res.body as SandboxDto;
    },
    async exec(id, command) {
      return sh(await manager.agentFor(orgId, id), command);
    },
    async otherOrganization() {
      const em = t.server.orm.em.fork();
      const user = `other-${randomBytes(4).toString("hex")}`;
      const key = "sbr_" + randomBytes(32).toString("hex");
      em.create(User, { id: user, name: "Other", email: "", role: "user", createdAt: new Date() });
      await em.flush();
      const other = await insertOrganization(execIn(em), { name: "Other", createdBy: user, personal: false });
      const { prefix, suffix } = keyEnds(key);
      em.create(ApiKeyRecord, {
        id: randomUUID(), organizationId: other, userId: user, name: "other-key", keyHash: hashApiKey(key), keyPrefix: prefix, keySuffix: suffix,
        permissions: ["write:sandboxes", "delete:sandboxes"], createdByKeyHash: null, createdAt: new Date(), lastUsedAt: null, expiresAt: null,
      });
      await em.flush();
      return { orgId: other, key };
    },
    stop: (opts?: { keepData?: boolean }) => t.stop(opts),
  };
}

