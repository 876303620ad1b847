/**
 * Tenancy: another organization's resources do not exist for a caller (issue 8, first test).
 *
 * Two organizations (see world.ts): B holds one of each resource the API can make; A's full-scope
 * key, A's signed-in owner, A's signed-in member (who is also B's member) and the bootstrap admin
 * key call every route of the contract with B's ids. Routes come from the same contract the
 * gateway serves (the REST route table, the toolbox's hand-written routes, every RPC over gRPC),
 * so a new route is covered without editing this file; a route with a path parameter ids.ts
 * cannot fill fails the suite, as does a request field naming a resource that bodies.ts does
 * not know.
 *
 * The rule: a call with B's ids answers exactly what the same call with ids that exist nowhere
 * answers, and that is a 404 (or, for a route refused whatever the id — an operator route, a
 * JWT-only route called with a key — that refusal). Never a 2xx, never a 5xx. A route whose
 * implementation is missing answers 501 both ways and is listed as not built. Routes naming an
 * organization are tried twice: B's organization in the path, and the caller's own organization
 * with B's other ids in the rest (B's role through A's path). Afterwards every stored row about
 * B is compared with the rows before the sweep, and B's people and key still work.
 * Run as root (a real sandbox).
 */
import { randomUUID } from "node:crypto";
import type { DescMethod, DescMethodServerStreaming, DescMethodUnary, DescService, Message } from "@bufbuild/protobuf";
import { Code, ConnectError, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Auth, filesIn, httpBindingsOf, routeOf, type Route } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DecodeErrors, messageFromJson, setField } from "../../packages/control/src/gateway/json.ts";
import { RouteTable } from "../../packages/control/src/gateway/route-table.ts";
import { issuerSettings, TestIssuer } from "../../packages/control/src/testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { SANDBOX_ID_HEADER } from "../../packages/control/src/call/call.ts";
import { TOOLBOX_PREFIXES } from "../../packages/control/src/toolbox/mount.ts";
import { TOOLBOX_REST_ROUTES } from "../../packages/control/src/toolbox/rest/index.ts";
import type { AgentLocator } from "../../packages/control/src/toolbox/agent-locator.ts";
import { ToolboxWebSockets } from "../../packages/control/src/toolbox/rest/websocket.ts";
import WebSocket from "ws";
import { BODY_CASES, bodyIdFields, NOT_FOREIGN, SAMPLE_REQUESTS } from "./bodies.ts";
import { CREDENTIAL_PARAMS, fillings, fillTemplate, idsFor, paramsOf, resourceParams } from "./ids.ts";
import { rowsOf } from "./rows.ts";
import { buildWorld, type Caller, type World } from "./world.ts";

const root = process.getuid?.() === 0;

const idp = new TestIssuer();
let t: TestServer;
let w: World;
let control: DescService[];
let agent: DescService[];
let before: Record<string, unknown[]>;

beforeAll(async () => {
  if (!root) return;
  await idp.start();
  await idp.addKey("k");
  // The internal registry runs, so registry-push-access is judged on what it answers, not on 503.
  t = await startTestServer({ settings: { ...issuerSettings(idp), internalRegistry: { enabled: true, host: "127.0.0.1", port: 0 } } });
  w = await buildWorld(t, idp);
  control = (await filesIn("sandbar/control/v1")).flatMap((f) => f.services);
  agent = (await filesIn("sandbar/agent/v1")).flatMap((f) => f.services);
  before = await rowsOf(t, bIds());
}, 600_000);

afterAll(async () => {
  await t?.stop();
  idp.stop();
});

/** Every id B's stored rows can be found by. */
const bIds = () => [w.B.org, w.B.sandbox, w.B.role, w.B.invitation, w.B.region, w.B.registry, w.B.snapshot, w.B.owner, "dan"];

/** One route of the contract, REST or toolbox. */
interface RestCase {
  verb: string;
  template: string;
  service: string;
  route: Route;
  /** The JSON body sent (an otherwise valid one where the route checks its body first), if any. */
  body?: Record<string, unknown>;
}

function restCases(): RestCase[] {
  const table = new RouteTable([{ services: control }, ...TOOLBOX_PREFIXES.map((prefix) => ({ services: agent, prefix, omitUnset: true }))]);
  const cases: RestCase[] = table.routes.map((r) => ({
    verb: r.verb,
    template: r.template,
    service: r.service.name,
    route: routeOf(r.method),
    body: r.body ? (SAMPLE_REQUESTS[`${r.service.name}.${r.method.name}`] ?? {}) : undefined,
  }));
  for (const prefix of TOOLBOX_PREFIXES) {
    for (const r of TOOLBOX_REST_ROUTES) {
      cases.push({ verb: r.verb, template: prefix + r.path, service: "toolbox", route: routeOf(r.handle.method), body: r.verb !== "GET" && r.verb !== "DELETE" ? {} : undefined });
    }
  }
  return cases;
}

/** What one call with B's ids is compared with: the same call with ids of nobody. */
interface Pair {
  label: string;
  got: string | number;
  unknown: string | number;
}

/** The verdict on one pair, REST statuses or gRPC codes. */
function judge(p: Pair, notFound: string | number, notBuiltAnswer: string | number, refusals: Array<string | number>): "ok" | "not built" | "refused" | string {
  if (p.got === notBuiltAnswer && p.unknown === notBuiltAnswer) return "not built";
  if (p.got !== p.unknown) return `${p.label}: B's ids answer ${p.got}, ids of nobody ${p.unknown}`;
  if (p.got === notFound) return "ok";
  if (refusals.includes(p.got)) return "refused";
  if (p.got === 400 || p.got === "InvalidArgument") return `${p.label}: ${p.got} both ways, checked before its ids are looked up: give it a valid request in SAMPLE_REQUESTS (test/tenancy/bodies.ts)`;
  return `${p.label}: ${p.got} for B's ids and for ids of nobody; an unknown id is a ${notFound}`;
}

/** Which callers try a route, and with which organization in its path. */
function plans(c: { template: string; service: string; route: Route }): Array<{ caller: Caller; ownOrg?: string }> {
  const params = paramsOf(c.template);
  const out: Array<{ caller: Caller; ownOrg?: string }> = [];
  for (const caller of w.callers) {
    // Operator routes act on any organization by contract (suspending B would be legitimate):
    // the operator test below checks who may call them.
    if (caller.operator && c.route.auth === Auth.SYSTEM_ADMIN) continue;
    const namesOrg = params.includes("organization_id");
    if (!(namesOrg && caller.memberOfB)) out.push({ caller });
    if (namesOrg && resourceParams(w, c.service, params).length > 0) out.push({ caller, ownOrg: caller.org });
  }
  return out;
}

describe.skipIf(!root)("another organization's resources", () => {
  // Without this, a typo in B's ids would make every 404 above meaningless.
  it("are real: B's owner reaches them through the same GET routes", async () => {
    const missing: string[] = [];
    let calls = 0;
    for (const c of restCases()) {
      const params = paramsOf(c.template);
      if (c.verb !== "GET" || params.length === 0 || params.some((p) => CREDENTIAL_PARAMS.has(p)) || c.route.auth === Auth.SYSTEM_ADMIN) continue;
      for (const f of fillings(w, c.service, params) ?? []) {
        const path = fillTemplate(c.template, f.theirs);
        // By name, a person reaches only their own keys: erin's key is tried as erin.
        let r = await head(w.B.ownerJwt, path);
        if (r.status === 404) r = await head(w.B.memberJwt, path);
        calls++;
        // A sandbox made from a snapshot has no build logs, one that is no fork no parent: 404s that
        // name the sandbox found. B's sandbox is private, and a private sandbox's /preview/{id}/public is a 404 by contract.
        if (r.status === 404 && !/has no (build info|parent)/.test(r.message) && !/^\/preview\/[^/]+\/public$/.test(path)) missing.push(`GET ${path}: ${r.message}`);
      }
    }
    console.log(`B's own people: ${calls} GET calls`);
    expect(missing).toEqual([]);
    // B's own GETs may change B (a signed preview URL made): what the other callers' sweep must
    // leave unchanged is B as it is now.
    before = await rowsOf(t, bIds());
  });

  it("answer as unknown ids (404) on every REST route, for keys and signed-in people", async () => {
    const problems: string[] = [];
    const unmapped = new Set<string>();
    const notBuilt = new Set<string>();
    const refused = new Map<string, Set<string>>();
    const found = new Map<string, boolean>();
    let calls = 0;
    for (const c of restCases()) {
      const params = paramsOf(c.template);
      if (params.length === 0 || params.some((p) => CREDENTIAL_PARAMS.has(p))) continue;
      const key = `${c.verb} ${c.template}`;
      if (!fillings(w, c.service, params)) {
        unmapped.add(`${key}: ${params.filter((p) => !idsFor(w, c.service, p)).join(", ")}`);
        continue;
      }
      if (!found.has(key)) found.set(key, c.route.auth === Auth.SYSTEM_ADMIN);
      await Promise.all(
        plans(c).map(async ({ caller, ownOrg }) => {
          for (const f of fillings(w, c.service, params, ownOrg)!) {
            const send = (values: Record<string, string>) => api(t.url, caller.token, c.verb, fillTemplate(c.template, values), c.body, caller.header);
            const [got, unknown] = [await send(f.theirs), await send(f.nobody)];
            calls += 2;
            const label = `${caller.name}: ${c.verb} ${fillTemplate(c.template, f.theirs)} (${brief(got.body)})`;
            const verdict = judge({ label, got: got.status, unknown: unknown.status }, 404, 501, [401, 403]);
            // The message must not tell the two apart either ("belongs to another organization").
            const [m1, m2] = [said(got.body, f.theirs), said(unknown.body, f.nobody)];
            if (verdict === "ok" && m1 !== m2) problems.push(`${label}: the message differs from an unknown id's: ${m1} / ${m2}`);
            else if (verdict === "ok") found.set(key, true);
            else if (verdict === "not built") notBuilt.add(key);
            else if (verdict === "refused") refused.set(key, new Set([...(refused.get(key) ?? []), `${caller.name} ${got.status}`]));
            else problems.push(verdict);
          }
        }),
      );
    }
    console.log(
      `cross-organization REST: ${found.size} routes with ids, ${calls} calls; not built (501): ${notBuilt.size}\n  ${[...notBuilt].join("\n  ")}\n` +
        `refused whatever the id for some callers:\n  ${[...refused].map(([k, v]) => `${k}: ${[...v].join(", ")}`).join("\n  ")}`,
    );
    expect([...unmapped], "path parameters this suite cannot fill: map them in test/tenancy/ids.ts").toEqual([]);
    expect(problems).toEqual([]);
    // A route refused to every caller whatever the id proves nothing about tenancy.
    const unproven = [...found].filter(([k, ok]) => !ok && !notBuilt.has(k)).map(([k]) => k);
    expect(unproven, "routes no caller reached far enough to look an id up").toEqual([]);
    expect(found.size).toBeGreaterThan(200);
  }, 120_000);

  it("answer NotFound (as unknown ids) on every RPC over gRPC", async () => {
    const transport = createGrpcTransport({ baseUrl: t.url });
    const problems: string[] = [];
    const unmapped: string[] = [];
    const notBuilt: string[] = [];
    let calls = 0;
    for (const [services, toolbox] of [[control, false], [agent, true]] as const) {
      for (const service of services) {
        for (const method of service.methods) {
          // Client and bidi streams (uploads, PTY input) open with the same guard as their unary
          // siblings, which the REST sweep and the unary methods here cover; filling a stream is not worth it.
          if (method.methodKind === "client_streaming" || method.methodKind === "bidi_streaming") continue;
          const fields = idFields(method);
          const names = fields.map((f) => f.name);
          if (names.some((n) => CREDENTIAL_PARAMS.has(n))) continue;
          // The toolbox names its sandbox in a header: every agent method is a sandbox's.
          const params = toolbox ? ["sandbox_id", ...names] : names;
          if (params.length === 0) continue;
          const route = { template: params.map((p) => `{${p}}`).join("/"), service: service.name, route: routeOf(method) };
          if (!fillings(w, service.name, params)) {
            unmapped.push(`${service.name}.${method.name}: ${params.filter((p) => !idsFor(w, service.name, p)).join(", ")}`);
            continue;
          }
          await Promise.all(
            plans(route).map(async ({ caller, ownOrg }) => {
              for (const f of fillings(w, service.name, params, ownOrg)!) {
                const call = async (values: Record<string, string>) => {
                  // Built as the gateway builds a REST call's message: the sample body, then the path's values.
                  const errs = new DecodeErrors();
                  const input = messageFromJson(method.input, SAMPLE_REQUESTS[`${service.name}.${method.name}`], errs);
                  for (const fd of fields) setField(input, fd, values[fd.name]!, "text", errs);
                  expect(errs.messages).toEqual([]);
                  const headers = { authorization: `Bearer ${caller.token}`, ...caller.header, ...(toolbox ? { [SANDBOX_ID_HEADER]: values.sandbox_id! } : {}) };
                  try {
                    await callOnce(transport, method, input, headers, 15_000);
                    return "OK";
                  } catch (err) {
                    return Code[ConnectError.from(err).code];
                  }
                };
                const [got, unknown] = [await call(f.theirs), await call(f.nobody)];
                calls += 2;
                const label = `${caller.name}: ${service.name}.${method.name}(${JSON.stringify(f.theirs)})`;
                const verdict = judge({ label, got, unknown }, "NotFound", "Unimplemented", ["Unauthenticated", "PermissionDenied"]);
                if (verdict === "not built") notBuilt.push(`${service.name}.${method.name}`);
                else if (verdict !== "ok" && verdict !== "refused") problems.push(verdict);
              }
            }),
          );
        }
      }
    }
    console.log(`cross-organization gRPC: ${calls} calls; not built: ${[...new Set(notBuilt)].join(", ")}`);
    expect(unmapped, "request fields this suite cannot fill: map them in test/tenancy/ids.ts").toEqual([]);
    expect(problems).toEqual([]);
    expect(calls).toBeGreaterThan(600);
  }, 120_000);

  it("refuse WebSocket upgrades (terminals, log following) as unknown ids do, before the handshake", async () => {
    // The toolbox's WebSocket routes, as the server mounts them (only their templates are read: the
    // locator is never asked).
    const locator: AgentLocator = { agentFor: () => Promise.reject(new Error("only route templates are read")), touch: () => {} };
    const sockets = new ToolboxWebSockets({ chain: t.server.chain, locator });
    const templates = sockets.routes(TOOLBOX_PREFIXES).map((r) => r.template);
    sockets.close();
    expect(templates.length).toBeGreaterThan(3);
    const problems: string[] = [];
    const opened: string[] = [];
    for (const template of templates) {
      const params = paramsOf(template);
      const all = fillings(w, "toolbox", params);
      expect(all, `${template}: map its parameters in ids.ts`).toBeDefined();
      for (const caller of w.callers) {
        for (const f of all!) {
          const [got, unknown] = [await upgrade(caller, fillTemplate(template, f.theirs)), await upgrade(caller, fillTemplate(template, f.nobody))];
          const verdict = judge({ label: `${caller.name}: upgrade ${fillTemplate(template, f.theirs)}`, got, unknown }, 404, 501, [401, 403]);
          if (verdict !== "ok" && verdict !== "refused") problems.push(verdict);
        }
      }
      // B's owner does open them (the refusals above are about whose ids, not about the route).
      const own = fillings(w, "toolbox", params)![0]!.theirs;
      if ((await upgrade({ ...w.A.owner, token: w.B.ownerJwt, header: w.B.header }, fillTemplate(template, own))) === 101) opened.push(template);
    }
    expect(problems).toEqual([]);
    expect(opened.length, `B's owner opened: ${opened.join(", ")}`).toBeGreaterThan(3);
  });

  it("answer as unknown ids when named in a request body (a role assigned, a region chosen)", async () => {
    const fields = bodyIdFields(control);
    const unknownFields = fields.filter((f) => !(f in BODY_CASES) && !(f in NOT_FOREIGN));
    expect(unknownFields, "request fields naming a resource: add them to test/tenancy/bodies.ts").toEqual([]);
    const problems: string[] = [];
    for (const [field, c] of Object.entries(BODY_CASES)) {
      // A's people and key, in A, where A's own invitation and member exist.
      for (const caller of [w.A.keyCaller, w.A.owner, w.A.member]) {
        const send = (value: string) => {
          const r = c.build(w, caller.org, value);
          return api(t.url, caller.token, r.verb, r.path, r.body, caller.header);
        };
        const got = await send(c.theirs(w));
        const unknown = await send(field.includes("region") || field.includes("target") ? `nowhere-${randomUUID().slice(0, 8)}` : randomUUID());
        const label = `${caller.name}: ${field} (${brief(got.body)})`;
        // Setting A's own OpenTelemetry config succeeds both ways; B's rows are compared at the end.
        if (field.endsWith("config.organization_id") && got.status === unknown.status && got.status < 300) continue;
        const verdict = judge({ label, got: got.status, unknown: unknown.status }, 404, 501, [400, 401, 403]);
        if (verdict !== "ok" && verdict !== "not built" && verdict !== "refused") problems.push(verdict);
      }
    }
    expect(problems).toEqual([]);
  }, 60_000);

  /**
   * The caller's audit log echoes the caller: each entry's metadata is the request it sent, and
   * the sweep's refused attempts name the ids it tried (B's, which it knew already). Those are
   * left out; everything else an entry says (targets of calls that went through, actors,
   * organizations) is scanned like any list.
   */
  const echoesLeftOut = (page: { items?: Array<{ statusCode?: number | null; metadata?: unknown }> }) => ({
    ...page,
    items: (page.items ?? []).filter((e) => e.statusCode == null || (e.statusCode > 0 && e.statusCode < 400)).map((e) => ({ ...e, metadata: undefined })),
  });

  it("are left out of every list", async () => {
    const secrets = [w.B.org, w.B.sandbox, w.B.sandboxName, w.B.role, w.B.invitation, w.B.region, w.B.registry, w.B.session, ...w.B.keyNames, "b-region", "b-registry", "b-role", "carol@example.test"];
    const lists = restCases().filter((c) => c.verb === "GET" && paramsOf(c.template).every((p) => p === "organization_id") && c.route.auth !== Auth.PUBLIC);
    expect(lists.length).toBeGreaterThan(15);
    const problems: string[] = [];
    let calls = 0;
    for (const caller of w.callers) {
      for (const c of lists) {
        // A person who is also B's member legitimately sees B among their own organizations.
        if (caller.memberOfB && c.route.userLevel) continue;
        if (caller.operator && c.route.auth === Auth.SYSTEM_ADMIN) continue;
        const base = fillTemplate(c.template, { organization_id: caller.org });
        // The lists' own filters, given B's ids, still find nothing of B's.
        const paths = c.service === "SandboxService" ? [base, `${base}?id=${w.B.sandbox}`, `${base}?name=${w.B.sandboxName}`, `${base}?regionIds=${w.B.region}`, `${base}?labels=${encodeURIComponent('{"tenant":"b"}')}`] : [base];
        for (const path of paths) {
          const r = await api(t.url, caller.token, "GET", path, undefined, caller.header);
          calls++;
          if (r.status >= 500 && r.status !== 501) problems.push(`${caller.name}: GET ${path} → ${r.status}`);
          const text = JSON.stringify(c.service === "AuditService" ? echoesLeftOut(r.body) : r.body);
          for (const s of secrets) if (text.includes(s)) problems.push(`${caller.name}: GET ${path} shows ${s}`);
        }
      }
    }
    console.log(`cross-organization lists: ${lists.length} list routes, ${calls} calls`);
    expect(problems).toEqual([]);
  });

  it("cannot be reached by choosing B's organization in the header without belonging to it", async () => {
    const problems: string[] = [];
    const stranger = { ...w.A.owner, header: w.B.header };
    for (const c of restCases()) {
      if (c.route.userLevel || c.route.auth === Auth.PUBLIC || c.route.auth === Auth.API_KEY) continue;
      const f = fillings(w, c.service, paramsOf(c.template).filter((p) => !CREDENTIAL_PARAMS.has(p)));
      if (!f || paramsOf(c.template).some((p) => CREDENTIAL_PARAMS.has(p))) continue;
      const r = await api(t.url, stranger.token, c.verb, fillTemplate(c.template, f[0]!.theirs), c.body, stranger.header);
      // An organization chosen by the header is context (403); one named in the path is a resource (404).
      const expected = c.route.auth === Auth.SYSTEM_ADMIN ? 403 : paramsOf(c.template).includes("organization_id") ? 404 : 403;
      if (r.status !== expected) problems.push(`${c.verb} ${c.template} → ${r.status} ${JSON.stringify(r.body?.message ?? r.body)} (expected ${expected})`);
    }
    expect(problems).toEqual([]);
  });

  it("user routes taking another person's id answer as their contract says (operators only)", async () => {
    const operatorRoutes = restCases().filter((c) => c.route.auth === Auth.SYSTEM_ADMIN && c.route.userLevel && paramsOf(c.template).some((p) => p === "id" || p === "user_id"));
    expect(operatorRoutes.map((c) => `${c.verb} ${c.template}`)).toEqual(expect.arrayContaining(["GET /users/{id}", "POST /users/{id}/regenerate-key-pair"]));
    for (const c of operatorRoutes) {
      for (const caller of [w.A.keyCaller, w.A.owner, w.A.member]) {
        const r = await api(t.url, caller.token, c.verb, fillTemplate(c.template, { id: w.B.owner, user_id: w.B.owner }), undefined, caller.header);
        expect(r.status, `${caller.name}: ${c.verb} ${c.template}`).toBe(403);
        expect(r.body.message).toBe("Access denied");
      }
    }
    // The operator reads anyone; a person reads only themselves through /users/me.
    const asOperator = await api(t.url, t.adminKey, "GET", `/users/${w.B.owner}`);
    expect(asOperator.status).toBe(200);
    expect(asOperator.body).toMatchObject({ id: "bob", email: "bob@example.test" });
    expect(asOperator.body.publicKeys?.some?.((k: { key?: string; privateKey?: string }) => k.privateKey)).toBeFalsy();
    const me = await api(t.url, w.A.owner.token, "GET", "/users/me", undefined, w.A.owner.header);
    expect(me.body.id).toBe("alice");
    // A sandbox's token names its sandbox to whoever holds it (the proxy's check); its
    // organization's OpenTelemetry config only to operators.
    const otel = `/organizations/otel-config/by-sandbox-auth-token/${w.B.authToken}`;
    for (const caller of [w.A.keyCaller, w.A.owner, w.A.member]) expect((await api(t.url, caller.token, "GET", otel, undefined, caller.header)).status).toBe(403);
  });

  it("are unchanged afterwards", async () => {
    const after = await rowsOf(t, bIds());
    expect(Object.keys(before)).toEqual(expect.arrayContaining(["organization", "organization_member", "organization_role", "organization_invitation", "api_key", "sandbox", "region"]));
    expect(after).toEqual(before);
    const asBob = (verb: string, path: string) => api(t.url, w.B.ownerJwt, verb, path, undefined, w.B.header);
    expect((await asBob("GET", `/sandbox/${w.B.sandbox}`)).body).toMatchObject({ state: "started", labels: { tenant: "b" } });
    expect((await api(t.url, w.B.key, "GET", "/api-keys/current")).status).toBe(200);
    expect((await asBob("GET", `/organizations/${w.B.org}`)).body.suspended).toBe(false);
    const members = (await asBob("GET", `/organizations/${w.B.org}/users`)).body as Array<{ userId: string; role: string }>;
    expect(members.map((m) => `${m.userId}:${m.role}`).sort()).toEqual(["bob:owner", "dan:member", "erin:member"]);
    expect((await asBob("GET", `/organizations/${w.B.org}/invitations`)).body.map((i: { id: string }) => i.id)).toEqual([w.B.invitation]);
    const exec = await api(t.url, w.B.key, "POST", `/toolbox/${w.B.sandbox}/toolbox/process/execute`, { command: "echo ok" });
    expect(exec.body).toMatchObject({ exitCode: 0, result: "ok\n" });
    // The comparison sees a change B makes itself (a role's description).
    const role = (await asBob("GET", `/organizations/${w.B.org}/roles`)).body.find((r: { id: string }) => r.id === w.B.role);
    const edit = await api(t.url, w.B.ownerJwt, "PUT", `/organizations/${w.B.org}/roles/${w.B.role}`, { ...role, description: "changed by B" }, w.B.header);
    expect(edit.status, brief(edit.body)).toBe(200);
    expect(await rowsOf(t, bIds())).not.toEqual(before);
    expect((await api(t.url, w.B.key, "DELETE", `/sandbox/${w.B.sandbox}`)).status).toBe(200);
  });
});

/** A WebSocket handshake's HTTP status (101 when it opened; closed at once). */
function upgrade(caller: Caller, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${t.url.replace("http", "ws")}/api${path}`, { headers: { authorization: `Bearer ${caller.token}`, ...caller.header }, handshakeTimeout: 10_000 });
    ws.on("unexpected-response", (_req, res) => {
      resolve(res.statusCode ?? 0);
      res.resume();
      ws.terminate();
    });
    ws.on("open", () => {
      resolve(101);
      ws.terminate();
    });
    ws.on("error", (err) => reject(err));
  });
}

/** A GET's status as B (a terminal's output is a stream that never ends: only its head is read). */
async function head(token: string, path: string): Promise<{ status: number; message: string }> {
  const res = await fetch(`${t.url}/api${path}`, { headers: { authorization: `Bearer ${token}`, ...w.B.header }, signal: AbortSignal.timeout(15_000) });
  if (res.status !== 404) {
    await res.body?.cancel();
    return { status: res.status, message: "" };
  }
  return { status: res.status, message: brief(await res.json()) };
}

/** An answer's message with the ids sent replaced by their parameter names. */
function said(body: unknown, values: Record<string, string>): string {
  let m = String((body as { message?: unknown } | undefined)?.message ?? "");
  for (const [k, v] of Object.entries(values).sort((a, b) => b[1].length - a[1].length)) m = m.split(v).join(`{${k}}`);
  return m;
}

/** An answer's message, short, for failure lists. */
const brief = (body: unknown) => String(JSON.stringify((body as { message?: unknown } | undefined)?.message ?? body ?? "")).slice(0, 120);

// DescMethod states its kind as a field, not as a union of the typed kinds: these narrow it.
const isUnary = (m: DescMethod): m is DescMethodUnary => m.methodKind === "unary";
const isServerStreaming = (m: DescMethod): m is DescMethodServerStreaming => m.methodKind === "server_streaming";

/**
 * One call of a unary or server-streaming method, as a generated client's method makes it
 * (createClient, for methods known only by their descriptor): a stream is read to its first message.
 */
async function callOnce(transport: Transport, method: DescMethod, input: Message, headers: Record<string, string>, timeoutMs: number): Promise<void> {
  if (isUnary(method)) {
    await transport.unary(method, undefined, timeoutMs, headers, input);
  } else if (isServerStreaming(method)) {
    const res = await transport.stream(method, undefined, timeoutMs, headers, (async function* () { yield input; })());
    for await (const _ of res.message) break;
  } else {
    throw new Error(`${method.name}: ${method.methodKind} methods are not called here`);
  }
}

/** Request fields that name a resource: those the method's REST rules take from the path. */
function idFields(method: DescMethod) {
  const params = new Set(httpBindingsOf(method).flatMap((b) => paramsOf(b.path)));
  return method.input.fields.filter((f) => f.fieldKind === "scalar" && params.has(f.name));
}
