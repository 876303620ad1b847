/**
 * The bad inputs a sweep measured as 5xx, each as its own case, and the limits that came with
 * them: ids and strings (NUL, length) checked before PostgreSQL or the agent, over REST and over
 * Connect; timeouts bounded; body size limits enforced after authentication with a JSON 413;
 * label and env limits; past expiry refused; a deleted sandbox readable as destroyed for a grace
 * period. One real server with one real sandbox. Run as root (real sandboxes).
 */
import { rm } from "node:fs/promises";
import { request } from "node:http";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { Code, ConnectError } from "@sandbar/protocol";
import { ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import {
  OrganizationInvitationService,
  OrganizationMemberService,
  OrganizationRoleService,
  OrganizationService,
} from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { WebhookService } from "@sandbar/protocol/gen/sandbar/control/v1/webhook_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { UntypedJson } from "../../packages/control/src/casts.ts";
import { api, buildAgentBundle, startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";

const root = process.getuid?.() === 0;
/** The timers' minute in this suite: also the destroyed grace period. */
const MINUTE_MS = 4000;

let t: TestServer;
let bundle: string;
let id: string;
const call = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => api(t.url, t.adminKey, method, path, body, headers);
const toolbox = (path: string) => `/toolbox/${id}/toolbox${path}`;

beforeAll(async () => {
  if (!root) return;
  bundle = await buildAgentBundle("sandbar-limits-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle, timerMinuteMs: MINUTE_MS } });
  const created = await call("POST", "/sandbox", { autoStopInterval: 0, labels: { suite: "limits" } });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  id = created.body.id;
}, 600_000);

afterAll(async () => {
  await t?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

/** A 4xx with the reference's JSON error body whose message matches. */
function expectError(res: { status: number; body: UntypedJson }, status: number, message: RegExp) {
  expect({ status: res.status, message: res.body?.message }).toMatchObject({ status, message: expect.stringMatching(message) });
  expect(res.body).toMatchObject({ statusCode: status, path: expect.any(String), timestamp: expect.any(String) });
}

describe.skipIf(!root)("ids and strings are checked before PostgreSQL and the agent", () => {
  it("NUL in an id, a name or a label filter is a 400 (PostgreSQL refused it: 500)", async () => {
    expectError(await call("GET", "/sandbox/a%00b"), 400, /sandboxId must not contain NUL characters/);
    expectError(await call("DELETE", "/api-keys/%00"), 400, /name must not contain NUL characters/);
    expectError(await call("GET", `/sandbox?labels=${encodeURIComponent('{"a":"\\u0000"}')}`), 400, /labels must not contain NUL/);
    expectError(await call("GET", `/sandbox?labels=${encodeURIComponent('{"a":"\\ud800"}')}`), 400, /invalid Unicode/);
    expectError(await call("POST", "/sandbox", { labels: { k: "a\u0000b" } }), 400, /labels\.k must be Unicode text without NUL/);
    expectError(await call("GET", `/sandbox/${"x".repeat(2000)}`), 400, /sandboxId must be shorter than or equal to 1024 characters/);
  });

  it("the same checks answer gRPC and Connect callers", async () => {
    const headers = { authorization: `Bearer ${t.adminKey}` };
    for (const transport of [createConnectTransport({ baseUrl: t.url, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: t.url })]) {
      const sandboxes = createClient(SandboxService, transport);
      const err = await sandboxes.getSandbox({ sandboxId: "a\u0000b" }, { headers }).catch((e: unknown) => ConnectError.from(e));
      expect(err).toMatchObject({ code: Code.InvalidArgument, rawMessage: "sandboxId must not contain NUL characters" });
      const process = createClient(ProcessService, transport);
      const long = await process.execute({ command: "true", cwd: "/".repeat(5000) }, { headers: { ...headers, "x-sandbar-sandbox-id": id } }).catch((e: unknown) => ConnectError.from(e));
      expect(long).toMatchObject({ code: Code.InvalidArgument, rawMessage: "cwd must be shorter than or equal to 4096 characters" });
      // Without credentials the input rules stay hidden.
      expect(await sandboxes.getSandbox({ sandboxId: "a\u0000b" }).catch((e: unknown) => ConnectError.from(e))).toMatchObject({ code: Code.Unauthenticated });
    }
  });

  it("toolbox: a 1 MB path, url, cwd or pty id is a 400, not an HTTP/2 frame error between control and agent", async () => {
    const mb = "a".repeat(1024 * 1024);
    expectError(await call("POST", toolbox("/git/clone"), { url: "https://example.com/x.git", path: mb }), 400, /path must be shorter than or equal to 4096/);
    expectError(await call("POST", toolbox("/git/clone"), { url: mb, path: "x" }), 400, /url must be shorter than or equal to 4096/);
    expectError(await call("GET", toolbox(`/git/status?path=${"p".repeat(6 * 1024)}`)), 400, /path must be shorter/);
    expectError(await call("POST", toolbox("/process/execute"), { command: "true", cwd: mb }), 400, /cwd must be shorter/);
    expectError(await call("POST", toolbox("/process/pty"), { id: mb }), 400, /id must be shorter than or equal to 1024/);
    expectError(await call("GET", `/toolbox/a%00b/toolbox/files?path=/`), 400, /sandboxId must not contain NUL/);
  });

  it("toolbox: a path at the limit still gets the agent's answer (its error echoes the path)", async () => {
    // One over-long name (ENAMETOOLONG), and a deep path of short multi-byte names (ENOENT,
    // echoed back in an error of about 24 KB once percent-encoded).
    const deep = "/" + "d".repeat(4095);
    const wide = ("/" + "é".repeat(99)).repeat(42).slice(0, 4096);
    for (const p of [deep, wide]) {
      const answers = [
        await call("GET", toolbox(`/git/status?path=${encodeURIComponent(p.slice(0, 2000))}`)),
        await call("POST", toolbox("/git/add"), { path: p, files: ["x"] }),
        await call("POST", toolbox("/process/execute"), { command: "true", cwd: p }),
        await call("POST", toolbox("/lsp/start"), { languageId: "python", pathToProject: p }),
      ];
      for (const res of answers) {
        expect(res.status).toBeGreaterThanOrEqual(400);
        expect(res.status).toBeLessThan(500);
        expect(res.body.message).toEqual(expect.any(String));
      }
    }
  });

  it("a clone of a relative path as its url is a 400 that says what a url is", async () => {
    expectError(await call("POST", toolbox("/git/clone"), { url: "../elsewhere", path: "cloned" }), 400, /url must be a URL/);
  });
});

describe.skipIf(!root)("input that reached PostgreSQL, the kernel or a recursive walk (500s of a later sweep)", () => {
  const headers = () => ({ authorization: `Bearer ${t.adminKey}` });
  const failure = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => ConnectError.from(e));

  it("an empty or null organizationId over Connect and gRPC is a 400 (PostgreSQL's uuid parser refused it)", async () => {
    for (const transport of [createConnectTransport({ baseUrl: t.url, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: t.url })]) {
      const members = createClient(OrganizationMemberService, transport);
      const roles = createClient(OrganizationRoleService, transport);
      const invitations = createClient(OrganizationInvitationService, transport);
      const webhooks = createClient(WebhookService, transport);
      const organizations = createClient(OrganizationService, transport);
      const empty = { code: Code.InvalidArgument, rawMessage: "organizationId should not be empty" };
      const organizationId = "";
      expect(await failure(members.listMembers({ organizationId }, { headers: headers() }))).toMatchObject(empty);
      expect(await failure(members.removeMember({ organizationId, userId: "someone" }, { headers: headers() }))).toMatchObject(empty);
      expect(await failure(members.updateAssignedRoles({ organizationId, userId: "someone" }, { headers: headers() }))).toMatchObject(empty);
      expect(await failure(roles.listRoles({ organizationId }, { headers: headers() }))).toMatchObject(empty);
      expect(await failure(invitations.listInvitations({ organizationId }, { headers: headers() }))).toMatchObject(empty);
      expect(await failure(webhooks.listWebhookEndpoints({ organizationId }, { headers: headers() }))).toMatchObject(empty);
      expect(await failure(organizations.listAvailableSandboxClasses({ organizationId }, { headers: headers() }))).toMatchObject(empty);
    }
    // Connect's JSON with null: the field's default, the same answer.
    const res = await fetch(`${t.url}/${OrganizationMemberService.typeName}/ListMembers`, { method: "POST", headers: { ...headers(), "content-type": "application/json" }, body: '{"organizationId":null}' });
    expect({ status: res.status, body: await res.json() }).toEqual({ status: 400, body: { code: "invalid_argument", message: "organizationId should not be empty" } });
  });

  it("dates outside years 1-9999 are a 400 over REST, and over gRPC (a Timestamp past its own range)", async () => {
    for (const path of ["/sandbox?createdAtAfter=", "/workspace?createdAtBefore=", "/sandbox/paginated?lastEventAfter=", "/admin/audit?from=", "/admin/audit?to="]) {
      const field = path.split("?")[1]!.slice(0, -1);
      expectError(await call("GET", path + encodeURIComponent("0000-01-01T00:00:00Z")), 400, new RegExp(`^${field} must be a valid ISO 8601 date string$`));
      expect((await call("GET", path + encodeURIComponent("0001-01-01T00:00:00Z"))).status).toBe(200);
    }
    const sandboxes = createClient(SandboxService, createGrpcTransport({ baseUrl: t.url }));
    const err = await failure(sandboxes.listSandboxes({ createdAtAfter: { seconds: -62135596801n, nanos: 0 } }, { headers: headers() }));
    expect(err).toMatchObject({ code: Code.InvalidArgument, rawMessage: "createdAtAfter must be a valid ISO 8601 date string" });
  });

  it("env values past the limits are a 400 on execute, code-run and terminals (the kernel refused them: E2BIG)", async () => {
    const big = { BIG: "v".repeat(1024 * 1024) };
    expectError(await call("POST", toolbox("/process/execute"), { command: "ls /", envs: big }), 400, /^envs\.BIG must be shorter than or equal to 65536 characters, envs must be smaller than 262144 characters/);
    expectError(await call("POST", toolbox("/process/code-run"), { code: "print(1)", envs: big }), 400, /envs\.BIG must be shorter than or equal to 65536 characters/);
    expectError(await call("POST", toolbox("/process/pty"), { id: "big-env", envs: big }), 400, /envs\.BIG must be shorter than or equal to 65536 characters/);
    const atLimit = await call("POST", toolbox("/process/execute"), { command: 'printf %s "$BIG" | wc -c', envs: { BIG: "v".repeat(64 * 1024) } });
    expect(atLimit).toMatchObject({ status: 200, body: { exitCode: 0, result: "65536\n" } });
  });

  it("a 1 MB commit message is committed (it goes to git on stdin, not as an argument: E2BIG)", async () => {
    expect((await call("POST", toolbox("/process/execute"), { command: "git init -q big-commit && echo x > big-commit/f" })).body.exitCode).toBe(0);
    expect((await call("POST", toolbox("/git/add"), { path: "big-commit", files: ["f"] })).status).toBe(200);
    const message = "m".repeat(1024 * 1024);
    const commit = await call("POST", toolbox("/git/commit"), { path: "big-commit", message, author: "a", email: "a@example.com" });
    expect(commit).toMatchObject({ status: 200, body: { hash: expect.stringMatching(/^[0-9a-f]{40}$/) } });
    const size = await call("POST", toolbox("/process/execute"), { command: "git -C big-commit log -1 --format=%B | wc -c" });
    expect(size.body.result).toBe(`${1024 * 1024 + 2}\n`); // the message, its line end, log's blank line
  });

  it("JSON nested deeper than 64 levels is a 400; wrong types for a JSON array too", async () => {
    const orgId = (await call("GET", `/sandbox/${id}`)).body.organizationId;
    const nested = (n: number) => '{"a":'.repeat(n) + "1" + "}".repeat(n);
    expectError(await call("PUT", `/organizations/${orgId}/experimental-config`, nested(100_000)), 400, /^request body nests deeper than 64 levels$/);
    expect((await call("PUT", `/organizations/${orgId}/experimental-config`, nested(63))).status).toBeLessThan(300);
    const endpoint = await call("POST", `/webhooks/organizations/${orgId}/endpoints`, { url: "https://example.com/hook" });
    const path = `/webhooks/organizations/${orgId}/endpoints/${endpoint.body.endpoint.id}`;
    expectError(await call("PATCH", path, `{"eventTypes":${nested(100_000)}}`), 400, /nests deeper than 64 levels/);
    expectError(await call("PATCH", path, { eventTypes: "sandbox.created" }), 400, /^eventTypes must be an array$/);
    expectError(await call("PATCH", path, { eventTypes: { a: 1 } }), 400, /^eventTypes must be an array$/);
    expectError(await call("PATCH", path, { eventTypes: [1, {}] }), 400, /^eventTypes must be an array of strings$/);
    expect((await call("PATCH", path, { eventTypes: ["sandbox.created"] })).body.eventTypes).toEqual(["sandbox.created"]);
    // Over Connect's JSON, protobuf-es refuses a Struct past 100 messages deep itself.
    const organizations = createClient(OrganizationService, createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", useBinaryFormat: false }));
    const deep = JSON.parse(nested(200));
    expect(await failure(organizations.setExperimentalConfig({ organizationId: orgId, config: deep }, { headers: headers() }))).toMatchObject({ code: Code.InvalidArgument });
  });

  it("numbers past a field's range are a 400 (a terminal's cols: uint32), before the WebSocket handshake", async () => {
    for (const [query, message] of [["cols=99999999999", "cols is out of range"], ["rows=4294967296", "rows is out of range"], ["cols=-1", "cols must not be less than 0"], ["cols=1.5", "cols must be an integer number"]]) {
      const refused = await new Promise<{ status?: number; body: string }>((resolve, reject) => {
        const req = request(`${t.url}/api${toolbox(`/process/pty/create-connect?id=range&${query}`)}`, {
          headers: { ...headers(), connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==" },
        });
        req.on("upgrade", (_res, socket) => {
          socket.destroy();
          resolve({ status: 101, body: "" });
        });
        req.on("response", (res) => {
          let body = "";
          res.setEncoding("utf8").on("data", (c: string) => (body += c)).on("end", () => resolve({ status: res.statusCode, body }));
        });
        req.on("error", reject);
        req.end();
      });
      expect({ status: refused.status, message: JSON.parse(refused.body || "{}").message }).toEqual({ status: 400, message });
    }
  });
});

describe.skipIf(!root)("requests Node refuses before routing", () => {
  it("a URL past the 16 KB header limit is a 431 with the JSON error body", async () => {
    const res = await fetch(`${t?.url ?? ""}/api/sandbox/${"x".repeat(20_000)}`);
    expect(res.status).toBe(431);
    expect(await res.json()).toMatchObject({ statusCode: 431, error: "Request Header Fields Too Large", message: expect.stringMatching(/16 KB/) });
  });
});

describe.skipIf(!root)("timeouts", () => {
  it("an execute timeout past what a timer holds is clamped (no limit in practice), not fired at once", async () => {
    for (const timeout of [2 ** 31, 2 ** 32 - 1]) {
      const res = await call("POST", toolbox("/process/execute"), { command: "sleep 0.2; echo done", timeout });
      expect(res).toMatchObject({ status: 200, body: { exitCode: 0, result: "done\n" } });
    }
    expectError(await call("POST", toolbox("/process/execute"), { command: "true", timeout: 2 ** 32 }), 400, /timeout is out of range/);
    expect((await call("POST", toolbox("/process/execute"), { command: "sleep 5", timeout: 1 })).status).toBe(408);
  });
});

describe.skipIf(!root)("request body size", () => {
  const big = () => JSON.stringify({ command: "true", pad: "z".repeat(11 * 1024 * 1024) });

  it("a JSON body over 10 MB is a 413 with the JSON error body, after the key is checked", async () => {
    expectError(await call("POST", "/api-keys", big()), 413, /Request body is larger than the limit of 10485760 bytes/);
    expectError(await call("POST", toolbox("/process/execute"), big()), 413, /larger than the limit/);
    expectError(await call("POST", toolbox("/git/clone"), big()), 413, /larger than the limit/);
    // No key, a wrong key, a key without the scope: refused first, the body never read.
    expectError(await api(t.url, undefined, "POST", "/api-keys", big()), 401, /Invalid credentials/);
    expectError(await api(t.url, "sbr_wrong", "POST", toolbox("/process/execute"), big()), 401, /Invalid credentials/);
    const narrow = await call("POST", "/api-keys", { name: "narrow", permissions: [] });
    expectError(await api(t.url, narrow.body.value, "POST", toolbox("/process/execute"), big()), 403, /Access denied/);
    // Connect and gRPC callers: one message over the limit is RESOURCE_EXHAUSTED.
    const process = createClient(ProcessService, createConnectTransport({ baseUrl: t.url, httpVersion: "1.1" }));
    const huge = await process.execute({ command: "#".repeat(11 * 1024 * 1024) }, { headers: { authorization: `Bearer ${t.adminKey}`, "x-sandbar-sandbox-id": id } }).catch((e: unknown) => ConnectError.from(e));
    expect(huge).toMatchObject({ code: Code.ResourceExhausted });
    // The connection stays usable after a 413.
    expect((await call("GET", "/api-keys/current")).status).toBe(200);
  });

  it("uploads stream: they are not held to the JSON limit", async () => {
    const form = new FormData();
    form.append("file", new Blob([Buffer.alloc(12 * 1024 * 1024, 7)]), "big.bin");
    const res = await fetch(`${t.url}/api${toolbox("/files/upload?path=big.bin")}`, { method: "POST", headers: { authorization: `Bearer ${t.adminKey}` }, body: form });
    expect(res.status).toBe(200);
    const info = await call("GET", toolbox("/files/info?path=big.bin"));
    expect(info.body.size).toBe(12 * 1024 * 1024);
  });
});

describe.skipIf(!root)("labels, env and keys", () => {
  it("labels and env are bounded, on create and on replace", async () => {
    const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"]));
    expectError(await call("POST", "/sandbox", { labels: many }), 400, /labels must contain no more than 64 elements/);
    expectError(await call("POST", "/sandbox", { labels: { big: "v".repeat(1025) } }), 400, /labels\.big must be shorter than or equal to 1024 characters/);
    expectError(await call("POST", "/sandbox", { labels: { ["k".repeat(256)]: "v" } }), 400, /each key in labels must be between 1 and 255 characters long/);
    expectError(await call("POST", "/sandbox", { env: { BIG: "v".repeat(65 * 1024) } }), 400, /env\.BIG must be shorter than or equal to 65536 characters/);
    expectError(await call("PUT", `/sandbox/${id}/labels`, { labels: { big: "v".repeat(1024 * 1024) } }), 400, /labels\.big must be shorter/);
    const half = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, "v".repeat(1000)]));
    expectError(await call("PUT", `/sandbox/${id}/labels`, { labels: half }), 400, /labels must be smaller than 16384 characters in all/);
    expect((await call("PUT", `/sandbox/${id}/labels`, { labels: { suite: "limits", ok: "v".repeat(1024) } })).status).toBe(200);
  });

  it("an API key that expired before it was made is refused", async () => {
    expectError(await call("POST", "/api-keys", { name: "stale", permissions: [], expiresAt: new Date(Date.now() - 60_000).toISOString() }), 400, /expiresAt must be in the future/);
    expect((await call("GET", "/api-keys/stale")).status).toBe(404);
    expect((await call("POST", "/api-keys", { name: "fresh", permissions: [], expiresAt: new Date(Date.now() + 3_600_000).toISOString() })).status).toBe(201);
  });
});

describe.skipIf(!root)("a deleted sandbox", () => {
  it("reads as destroyed by id for a grace period (one timer minute), outside every list, then 404", async () => {
    const other = (await call("POST", "/sandbox", { name: "short-lived", labels: { suite: "grace" } })).body;
    const deleted = await call("DELETE", `/sandbox/${other.id}`);
    expect(deleted.body.state).toBe("destroyed");
    const read = await call("GET", `/sandbox/${other.id}`);
    expect(read).toMatchObject({ status: 200, body: { id: other.id, state: "destroyed", desiredState: "destroyed" } });
    expect((await call("GET", `/sandbox?labels=${encodeURIComponent('{"suite":"grace"}')}`)).body).toEqual([]);
    // By name, and for every other operation, it is gone already.
    expect((await call("GET", "/sandbox/short-lived")).status).toBe(404);
    expect((await call("POST", `/sandbox/${other.id}/start`)).status).toBe(404);
    expect((await call("DELETE", `/sandbox/${other.id}`)).status).toBe(404);
    expect((await call("POST", toolbox("/process/execute").replace(id, other.id), { command: "true" })).status).toBe(404);
    // Once the grace (one timer minute) has run out.
    await eventually("the destroyed sandbox to read as gone", async () => (await call("GET", `/sandbox/${other.id}`)).status === 404, 10 * MINUTE_MS);
    expectError(await call("GET", `/sandbox/${other.id}`), 404, /not found/);
  }, 120_000);
});
