/**
 * The malformed-input sweep: every REST route of the contract (read from the same google.api.http
 * rules the gateway serves, so a new route is swept without editing this file), plus the toolbox
 * routes with wire formats of their own and the WebSocket routes, each sent broken input: path
 * parameters with NUL bytes, over-long and badly percent-encoded; bodies that are not JSON, not
 * objects, or nested thousands deep; every field of the request with the wrong type, NUL, invalid
 * Unicode, over-long text, numbers out of its range, wrong types inside arrays, deep JSON, dates
 * outside years 1-9999 in every timestamp and date-like field, and empty ids in every id field.
 * No answer may be a 5xx (a 501 only from a route that answers 501 to an ordinary call too), and
 * every error must be the JSON error body with a message. Toolbox routes run against a real
 * sandbox created through the API. Run as root (real sandboxes).
 */
import { rm } from "node:fs/promises";
import { request } from "node:http";
import type { DescField, DescMessage } from "@bufbuild/protobuf";
import { ScalarType } from "@bufbuild/protobuf";
import { filesIn } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { UntypedJson } from "../../packages/control/src/casts.ts";
import { RouteTable, type RestRoute } from "../../packages/control/src/gateway/route-table.ts";
import { buildAgentBundle, startTestServer, type TestServer } from "../../packages/control/src/testing/server.ts";
import { TOOLBOX_PREFIXES } from "../../packages/control/src/toolbox/mount.ts";
import { TOOLBOX_REST_ROUTES } from "../../packages/control/src/toolbox/rest/index.ts";
import { TOOLBOX_WS_PATHS } from "../../packages/control/src/toolbox/rest/websocket.ts";
import { maxLengthOf } from "../../packages/control/src/services/validate.ts";

const root = process.getuid?.() === 0;

/** One request of the sweep. */
interface Probe {
  what: string;
  verb: string;
  path: string;
  query?: string;
  body?: string;
}

interface Outcome {
  probe: Probe;
  status: number;
  message: unknown;
  contentType: string;
}

const NUL = "a\u0000b";
const LONG_PARAM = "x".repeat(8 * 1024); // past every id and path limit, within the 16 KB header limit
const LONG_TEXT = "y".repeat(64 * 1024);
const LONE_SURROGATE = "\ud800";
/** JSON nested `n` deep, as text (JSON.stringify of it would recurse). */
const deepText = (n: number) => "[".repeat(n) + "]".repeat(n);
/** A value 100 objects deep: past the 64 levels a request may nest. */
const DEEP: unknown = JSON.parse('{"a":'.repeat(100) + "1" + "}".repeat(100));
/** An object 50000 deep, as text: deep enough to overflow a recursive walk of it. */
const VERY_DEEP = '{"a":'.repeat(50_000) + "1" + "}".repeat(50_000);
/** Past the 128 KiB the kernel takes per argument or environment variable. */
const MB_TEXT = "z".repeat(1024 * 1024);
/** Dates outside years 1-9999 (PostgreSQL's range error, once a 500). */
const BAD_DATES = ["0000-01-01T00:00:00Z", "0000-12-31T23:59:59Z", "0001-01-01T00:00:00+01:00", "+010000-01-01T00:00:00Z", "-000001-01-01T00:00:00Z", "10000-01-01"];
/** Names of fields that hold dates without being Timestamps. */
const DATE_LIKE = /(^|_)(at|date|time|since|until|from|to|after|before)$/;

let t: TestServer;
let bundle: string;
let sandboxId: string;
let organizationId: string;
let table: RouteTable;

beforeAll(async () => {
  if (!root) return;
  bundle = await buildAgentBundle("sandbar-sweep-agent-");
  t = await startTestServer({ settings: { agentBundle: bundle, internalRegistry: { enabled: true, host: "127.0.0.1", port: 0 } } });
  const created = await call({ what: "create", verb: "POST", path: "/sandbox", body: JSON.stringify({ labels: { suite: "sweep" }, autoStopInterval: 0 }) }, 300_000);
  expect(created.status, JSON.stringify(created.json)).toBe(200);
  sandboxId = created.json.id;
  organizationId = created.json.organizationId;
  const control = (await filesIn("sandbar/control/v1")).flatMap((f) => f.services);
  const agent = (await filesIn("sandbar/agent/v1")).flatMap((f) => f.services);
  table = new RouteTable([{ services: control }, ...TOOLBOX_PREFIXES.map((prefix) => ({ services: agent, prefix, omitUnset: true }))]);
}, 600_000);

afterAll(async () => {
  await t?.stop();
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

async function call(p: Probe, timeoutMs = 30_000): Promise<{ status: number; json: UntypedJson; contentType: string }> {
  const url = `${t.url}/api${p.path}${p.query ? `?${p.query}` : ""}`;
  const res = await fetch(url, {
    method: p.verb,
    headers: { authorization: `Bearer ${t.adminKey}`, ...(p.body === undefined ? {} : { "content-type": "application/json" }) },
    body: p.verb === "GET" || p.verb === "HEAD" ? undefined : p.body,
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await res.text();
  let json: UntypedJson;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = text;
  }
  return { status: res.status, json, contentType: res.headers.get("content-type") ?? "" };
}

/** Percent-encodes a path segment or query value, keeping lone surrogates (which encodeURIComponent refuses) as their raw UTF-8 bytes. */
function enc(s: string): string {
  return s === LONE_SURROGATE ? "%ED%A0%80" : encodeURIComponent(s);
}

const isToolbox = (template: string) => TOOLBOX_PREFIXES.some((p) => template.startsWith(p));

/**
 * The route's path with each parameter filled: the real sandbox for toolbox routes, the real
 * organization for reads and updates (so probes get past the guard to the decoder, the audit
 * entry and the handler; creates and deletes get one that does not exist, so that a probe the
 * handler takes changes nothing), else a name that exists nowhere.
 */
function fill(template: string, override: Record<string, string> = {}, raw = false, verb = "GET"): string {
  return template.replace(/\{([a-z0-9_]+)(=[^}]*)?\}/g, (_m, name: string) => {
    if (name in override) return raw ? override[name] : enc(override[name]);
    if (name === "sandbox_id" && isToolbox(template)) return sandboxId;
    if (name === "organization_id" && ["GET", "PUT", "PATCH"].includes(verb)) return organizationId;
    return name.endsWith("id") ? "00000000-0000-4000-8000-000000000000" : "nothing-here";
  });
}

function paramsOf(template: string): string[] {
  return [...template.matchAll(/\{([a-z0-9_]+)/g)].map((m) => m[1]);
}

/** Wrong-typed, broken and extreme values for one field, as JSON values. */
function badValues(field: DescField): Array<[string, unknown]> {
  const out: Array<[string, unknown]> = [];
  const scalar = field.fieldKind === "scalar" || (field.fieldKind === "list" && field.listKind === "scalar") ? field.scalar : undefined;
  const wrap = (v: unknown) => (field.fieldKind === "list" ? [v] : v);
  if (field.fieldKind === "list") out.push(["not an array", { a: 1 }]);
  if (field.fieldKind === "map" && /env/.test(field.name)) out.push(["map with a 1 MB value", { BIG: MB_TEXT }]);
  if (field.fieldKind === "map") out.push(["map as an array", [1, 2]], ["map with a NUL value", { k: NUL }], ["map with a NUL key", { [NUL]: "v" }], ["map with a long value", { k: LONG_TEXT }], ["map with a long key", { [LONG_TEXT]: "v" }], ["map of numbers", { k: 1 }]);
  if (field.fieldKind === "message" || (field.fieldKind === "list" && field.listKind === "message")) out.push(["message as a number", wrap(5)], ["message as a string", wrap("str")]);
  if (field.fieldKind === "enum" || (field.fieldKind === "list" && field.listKind === "enum")) out.push(["unknown enum value", wrap("no-such-value")], ["enum as a number", wrap(99)]);
  const message = field.fieldKind === "message" || (field.fieldKind === "list" && field.listKind === "message") ? field.message.typeName : undefined;
  if (message === "google.protobuf.Timestamp") for (const d of BAD_DATES) out.push([`date ${d}`, wrap(d)]);
  if (message === "google.protobuf.ListValue") out.push(["text for a JSON array", "text"], ["object for a JSON array", { a: 1 }], ["mixed JSON array", [1, "x", {}, null, []]]);
  if (message !== undefined) out.push(["100 levels deep", wrap(DEEP)]);
  // Wrong types inside an array: every element type at once.
  if (field.fieldKind === "list") out.push(["array of mixed types", [1, "x", true, {}, null, [], 1e300]]);
  if (scalar === ScalarType.STRING) {
    out.push(["NUL in text", wrap(NUL)], ["64 KB text", wrap(LONG_TEXT)], ["lone surrogate", wrap(LONE_SURROGATE)], ["number for text", wrap(12345)], ["object for text", wrap({ a: 1 })]);
    if (field.name === "id" || field.name.endsWith("_id") || field.name.endsWith("_ids")) out.push(["empty id", wrap("")], ["blank id", wrap("  ")], ["null id", null]);
    if (maxLengthOf(field.name) === Infinity) out.push(["1 MB text", wrap(MB_TEXT)]);
    if (DATE_LIKE.test(field.name)) for (const d of BAD_DATES) out.push([`date ${d}`, wrap(d)]);
  } else if (scalar === ScalarType.BOOL) {
    out.push(["text for a boolean", wrap("maybe")], ["number for a boolean", wrap(2)]);
  } else if (scalar === ScalarType.BYTES) {
    out.push(["bytes that are not base64", wrap("%%%")]);
  } else if (scalar !== undefined) {
    out.push(["huge number", wrap(1e300)], ["past 2^64", wrap(2 ** 64)], ["past 2^31", wrap(2 ** 31)], ["past 2^32", wrap(99999999999)], ["below -2^31", wrap(-(2 ** 31) - 1)], ["past 2^53", wrap(2 ** 53 + 2)]);
    out.push(["negative", wrap(-1)], ["fraction", wrap(0.5)], ["text for a number", wrap("abc")]);
  }
  return out;
}

/** Query text of a bad JSON value: lists repeat, everything else is its text. */
function queryText(name: string, v: unknown): string {
  const one = (x: unknown) => {
    const text = typeof x === "string" ? x : JSON.stringify(x);
    return `${name}=${enc(text.length > LONG_PARAM.length ? LONG_PARAM : text)}`;
  };
  return Array.isArray(v) ? v.map(one).join("&") : one(v);
}

function probesOf(route: RestRoute): Probe[] {
  const probes: Probe[] = [];
  const verb = route.verb;
  const params = paramsOf(route.template);
  const body = route.body ? "{}" : undefined;
  for (const name of params) {
    if (name === "sandbox_id" && isToolbox(route.template) && name === params[0]) {
      probes.push({ what: `${name}: NUL`, verb, path: fill(route.template, { [name]: NUL }, false, verb), body });
      continue;
    }
    probes.push({ what: `${name}: NUL`, verb, path: fill(route.template, { [name]: NUL }, false, verb), body });
    probes.push({ what: `${name}: 8 KB`, verb, path: fill(route.template, { [name]: LONG_PARAM }, false, verb), body });
    probes.push({ what: `${name}: lone surrogate`, verb, path: fill(route.template, { [name]: LONE_SURROGATE }, false, verb), body });
    probes.push({ what: `${name}: bad percent-encoding`, verb, path: fill(route.template, { [name]: "%E0%A4%A" }, true, verb), body });
  }
  const path = fill(route.template, {}, false, verb);
  if (route.body) {
    probes.push({ what: "malformed JSON", verb, path, body: '{"a": ' });
    probes.push({ what: "JSON array body", verb, path, body: "[1, 2]" });
    probes.push({ what: "JSON string body", verb, path, body: '"text"' });
    probes.push({ what: "body 100000 levels deep", verb, path, body: deepText(100_000) });
  }
  const bound = new Set(params);
  const input: DescMessage = route.method.input;
  const bodyField = route.body && route.body !== "*" ? input.fields.find((f) => f.name === route.body) : undefined;
  for (const field of input.fields) {
    if (bound.has(field.name)) continue;
    for (const [what, value] of badValues(field)) {
      const label = `${field.jsonName}: ${what}`;
      if (route.body === "*") probes.push({ what: label, verb, path, body: JSON.stringify({ [field.jsonName]: value }) });
      else if (value === null) continue; // absent from a query
      else if (field === bodyField) probes.push({ what: label, verb, path, body: JSON.stringify(value) });
      else probes.push({ what: label, verb, path, query: queryText(field.jsonName, value), body });
    }
  }
  // Far too deep for any walk that recurses (JSON.stringify included: the body is written as text).
  for (const field of input.fields) {
    if (bound.has(field.name) || field.fieldKind !== "message") continue;
    const label = `${field.jsonName}: 50000 levels deep`;
    if (route.body === "*") probes.push({ what: label, verb, path, body: `{"${field.jsonName}":${VERY_DEEP}}` });
    else if (field === bodyField) probes.push({ what: label, verb, path, body: VERY_DEEP });
  }
  return probes;
}

/** What an ordinary call of the route answers: a 501 here means the route is not implemented. */
async function baseline(route: RestRoute): Promise<number> {
  return (await call({ what: "baseline", verb: route.verb, path: fill(route.template, {}, false, route.verb), body: route.body ? "{}" : undefined })).status;
}

function check(outcomes: Outcome[], unimplemented: boolean): string[] {
  const bad: string[] = [];
  for (const o of outcomes) {
    const label = `${o.probe.verb} ${o.probe.path.slice(0, 120)}${o.probe.query ? `?${o.probe.query.slice(0, 60)}` : ""} [${o.probe.what}] → ${o.status}`;
    if (o.status >= 500 && !(o.status === 501 && unimplemented)) bad.push(`${label}: ${String(o.message).slice(0, 200)}`);
    else if (o.status >= 400 && (typeof o.message !== "string" || o.message === "" || !o.contentType.includes("application/json"))) bad.push(`${label}: no JSON error body with a message`);
  }
  return bad;
}

async function sweep(routes: RestRoute[]): Promise<{ requests: number; problems: string[]; statuses: Map<number, number> }> {
  let requests = 0;
  const statuses = new Map<number, number>();
  const problems: string[] = [];
  for (const route of routes) {
    const unimplemented = (await baseline(route)) === 501;
    const outcomes: Outcome[] = [];
    for (const probe of probesOf(route)) {
      requests++;
      try {
        const r = await call(probe);
        outcomes.push({ probe, status: r.status, message: r.json?.message, contentType: r.contentType });
        statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
      } catch (err) {
        problems.push(`${probe.verb} ${probe.path.slice(0, 120)} [${probe.what}]: no answer (${(err as Error).message})`);
      }
    }
    problems.push(...check(outcomes, unimplemented));
  }
  return { requests, problems, statuses };
}

describe.skipIf(!root)("malformed input on every route", () => {
  it("control routes: no 5xx, always a JSON error with a message", async () => {
    const routes = table.routes.filter((r) => !isToolbox(r.template));
    expect(routes.length).toBeGreaterThan(40);
    const { requests, problems } = await sweep(routes);
    expect(requests).toBeGreaterThan(1000);
    expect(problems).toEqual([]);
  }, 900_000);

  it("toolbox routes against a real sandbox, both prefixes", async () => {
    const routes = table.routes.filter((r) => isToolbox(r.template));
    expect(routes.length).toBeGreaterThan(40);
    // The probes reach the agent: an ordinary read answers.
    expect((await call({ what: "read", verb: "GET", path: `/toolbox/${sandboxId}/toolbox/files`, query: "path=/" })).status).toBe(200);
    const { requests, problems, statuses } = await sweep(routes);
    expect(requests).toBeGreaterThan(1000);
    expect(problems).toEqual([]);
    // Past the gateway's checks: the agent itself answered some (not found, refused, or done).
    expect((statuses.get(404) ?? 0) + (statuses.get(200) ?? 0)).toBeGreaterThan(50);
    // The sandbox still answers after all that.
    const after = await call({ what: "after", verb: "POST", path: `/toolbox/${sandboxId}/toolbox/process/execute`, body: JSON.stringify({ command: "echo alive" }) });
    expect(after).toMatchObject({ status: 200, json: { exitCode: 0, result: "alive\n" } });
  }, 900_000);

  it("toolbox routes with wire formats of their own (multipart, raw streams): broken parameters and bodies", async () => {
    const problems: string[] = [];
    for (const prefix of TOOLBOX_PREFIXES) {
      for (const r of TOOLBOX_REST_ROUTES) {
        const template = prefix + r.path;
        const probes: Probe[] = [];
        for (const name of paramsOf(template)) {
          probes.push({ what: `${name}: NUL`, verb: r.verb, path: fill(template, { [name]: NUL }), body: "{}" });
          probes.push({ what: `${name}: 8 KB`, verb: r.verb, path: fill(template, { [name]: LONG_PARAM }), body: "{}" });
        }
        const path = fill(template);
        probes.push({ what: "malformed JSON", verb: r.verb, path, body: '{"a": ' });
        probes.push({ what: "JSON array", verb: r.verb, path, body: "[1]" });
        for (const q of ["path", "cwd", "id", "follow", "recursive"]) {
          probes.push({ what: `${q}: NUL in the query`, verb: r.verb, path, query: `${q}=${enc(NUL)}` });
          probes.push({ what: `${q}: 8 KB in the query`, verb: r.verb, path, query: `${q}=${LONG_PARAM}` });
        }
        probes.push({ what: "body 100000 levels deep", verb: r.verb, path, body: deepText(100_000) });
        for (const field of ["command", "cwd", "sessionId", "id", "path", "paths", "timeout", "cols", "rows", "envs"]) {
          for (const v of [NUL, LONG_TEXT, 1e300, 99999999999, -1, "", { a: 1 }, [NUL], [1, {}, null], DEEP]) probes.push({ what: `${field}: ${JSON.stringify(v).slice(0, 20)}`, verb: r.verb, path, body: JSON.stringify({ [field]: v }) });
        }
        probes.push({ what: "envs: a 1 MB value", verb: r.verb, path, body: JSON.stringify({ command: "ls /", envs: { BIG: MB_TEXT } }) });
        const outcomes: Outcome[] = [];
        for (const probe of probes) {
          const res = await call(probe);
          outcomes.push({ probe, status: res.status, message: res.json?.message, contentType: res.contentType });
        }
        problems.push(...check(outcomes, false));
      }
    }
    expect(problems).toEqual([]);
  }, 900_000);

  it("WebSocket routes: bad parameters are refused before the handshake, with a status", async () => {
    const problems: string[] = [];
    const values = ["99999999999", "-1", "1.5", "abc", NUL, "", LONG_PARAM];
    for (const prefix of TOOLBOX_PREFIXES) {
      for (const wsPath of TOOLBOX_WS_PATHS) {
        const template = prefix + wsPath;
        const outcomes: Outcome[] = [];
        for (const name of ["cols", "rows", "id", "cwd", "follow"]) {
          for (const v of values) {
            const probe: Probe = { what: `${name}: ${JSON.stringify(v).slice(0, 20)}`, verb: "GET", path: fill(template), query: `${name}=${enc(v)}` };
            const r = await upgrade(probe);
            outcomes.push({ probe, status: r.status, message: r.json?.message, contentType: r.contentType });
          }
        }
        problems.push(...check(outcomes, false));
      }
    }
    expect(problems).toEqual([]);
  }, 900_000);
});

/** A WebSocket handshake: the refusal's status and body, or 101 (the socket then closed). */
function upgrade(p: Probe): Promise<{ status: number; json: UntypedJson; contentType: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${t.url}/api${p.path}${p.query ? `?${p.query}` : ""}`, {
      headers: { authorization: `Bearer ${t.adminKey}`, connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==" },
      signal: AbortSignal.timeout(30_000),
    });
    req.on("upgrade", (_res, socket) => {
      socket.destroy();
      resolve({ status: 101, json: undefined, contentType: "" });
    });
    req.on("response", (res) => {
      let text = "";
      res.setEncoding("utf8").on("data", (c: string) => (text += c));
      res.on("end", () => {
        let json: UntypedJson;
        try {
          json = JSON.parse(text);
        } catch {
          json = text;
        }
        resolve({ status: res.statusCode ?? 0, json, contentType: String(res.headers["content-type"] ?? "") });
      });
    });
    req.on("error", reject);
    req.end();
  });
}
