import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { PREFIXES, PREVIEW_TOKEN, startFixture, toolboxFetch, type Fixture } from "./test-fixture.ts";
import { eventually } from "../../../../protocol/src/testing/eventually.ts";
import type { UntypedJson } from "../../casts.ts";

// Sessions through the REST toolbox into a real agent: statuses, the output shapes of each
// SDK generation, plain and JSON logs, and log following over chunked HTTP and WebSocket.

let f: Fixture;
beforeAll(async () => {
  f = await startFixture();
});
afterAll(async () => f?.stop());

const V0111 = { "x-daytona-sdk-version": "0.111.1" };
const V0256 = { "x-daytona-sdk-version": "0.25.6" };
const V0218 = { "x-daytona-sdk-version": "0.218.0" };
const OUT = "\x01\x01\x01";
const ERR = "\x02\x02\x02";

/** The SDKs' demultiplexer: bytes belong to the stream of the marker before them. */
function demux(log: string): { stdout: string; stderr: string } {
  const out = { stdout: "", stderr: "" };
  let current: "stdout" | "stderr" | undefined;
  for (const piece of log.split(/(\x01\x01\x01|\x02\x02\x02)/)) {
    if (piece === OUT) current = "stdout";
    else if (piece === ERR) current = "stderr";
    else if (current) out[current] += piece;
  }
  return out;
}

async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}, prefix?: string) {
  const res = await toolboxFetch(f, path, {
    method,
    prefix,
    body: body === undefined ? undefined : JSON.stringify(body),
    headers: { ...(body === undefined ? {} : { "content-type": "application/json" }), ...headers },
  });
  const text = await res.text();
  let json: UntypedJson;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, text, json, headers: res.headers };
}

let n = 0;
async function newSession(prefix?: string): Promise<string> {
  const id = `s-${++n}`;
  const res = await call("POST", "/process/session", { sessionId: id }, {}, prefix);
  expect(res.status).toBe(201);
  return id;
}

async function waitExit(sid: string, cid: string): Promise<number> {
  let code: number | null | undefined;
  await eventually(`command ${cid} to exit`, async () => (code = (await call("GET", `/process/session/${sid}/command/${cid}`)).json.exitCode) !== undefined && code !== null);
  return code!;
}

const MIXED = "echo out1; echo err1 >&2; sleep 0.05; echo out2; printf partial";

describe("session lifecycle", () => {
  it("creates (201), refuses a duplicate (409), keeps shell state, lists, deletes", async () => {
    for (const prefix of PREFIXES) {
      const sid = await newSession(prefix);
      expect((await call("POST", "/process/session", { sessionId: sid }, {}, prefix)).status).toBe(409);
      await call("POST", `/process/session/${sid}/exec`, { command: "export GREETING='it''s'; cd /tmp" }, V0111, prefix);
      const res = await call("POST", `/process/session/${sid}/exec`, { command: 'echo "$GREETING $(pwd)"' }, V0256, prefix);
      expect(res.json).toMatchObject({ output: "its /tmp\n", exitCode: 0 });
      const session = await call("GET", `/process/session/${sid}`, undefined, {}, prefix);
      expect(session.json.sessionId).toBe(sid);
      expect(session.json.commands).toHaveLength(2);
      expect((await call("GET", "/process/session", undefined, {}, prefix)).json.map((s: { sessionId: string }) => s.sessionId)).toContain(sid);
      expect((await call("DELETE", `/process/session/${sid}`, undefined, {}, prefix)).status).toBeLessThan(300);
      expect((await call("GET", `/process/session/${sid}`, undefined, {}, prefix)).json.statusCode).toBe(404);
    }
  });

  it("is 404 with statusCode for exec into a missing session", async () => {
    const res = await call("POST", "/process/session/nope/exec", { command: "true" }, V0111);
    expect(res.status).toBe(404);
    expect(res.json.statusCode).toBe(404);
  });
});

describe("synchronous exec output by SDK version", () => {
  it("0.111.1: marked output, stdout/stderr left to the client", async () => {
    const sid = await newSession();
    const res = await call("POST", `/process/session/${sid}/exec`, { command: MIXED }, V0111);
    expect(res.status).toBe(200);
    expect(res.json.exitCode).toBe(0);
    expect(res.json.stdout).toBeNull();
    expect(res.json.stderr).toBeNull();
    expect(res.json.output).toContain(`${OUT}out1\n`);
    expect(res.json.output).toContain(`${ERR}err1\n`);
    expect(demux(res.json.output)).toEqual({ stdout: "out1\nout2\npartial\n", stderr: "err1\n" });
  });

  it("0.218.0: the server splits stdout and stderr", async () => {
    const sid = await newSession();
    const res = await call("POST", `/process/session/${sid}/exec`, { command: `${MIXED}; exit 3` }, V0218);
    expect(res.json).toMatchObject({ stdout: "out1\nout2\npartial\n", stderr: "err1\n", exitCode: 3 });
    expect(demux(res.json.output)).toEqual({ stdout: "out1\nout2\npartial\n", stderr: "err1\n" });
  });

  it("0.25.6 and clients without a version: plain combined text; X-Daytona-Split-Output keeps markers", async () => {
    const sid = await newSession();
    for (const headers of [V0256, {}]) {
      const res = await call("POST", `/process/session/${sid}/exec`, { command: MIXED }, headers);
      expect(res.json.output).not.toMatch(/[\x01\x02]/);
      expect(res.json.output.split("\n").sort()).toEqual(["", "err1", "out1", "out2", "partial"]);
      expect(res.json.stdout).toBeNull();
    }
    const split = await call("POST", `/process/session/${sid}/exec`, { command: MIXED }, { "x-daytona-split-output": "true" });
    expect(demux(split.json.output)).toEqual({ stdout: "out1\nout2\npartial\n", stderr: "err1\n" });
  });

  it("async (runAsync or async): 202 with the command id and nulls", async () => {
    const sid = await newSession();
    for (const flag of ["runAsync", "async"]) {
      const res = await call("POST", `/process/session/${sid}/exec`, { command: "sleep 0.2; echo done", [flag]: true }, V0111);
      expect(res.status).toBe(202);
      expect(res.json).toEqual({ cmdId: expect.any(String), output: null, stdout: null, stderr: null, exitCode: null });
      expect(await waitExit(sid, res.json.cmdId)).toBe(0);
    }
  });
});

describe("command logs", () => {
  let sid: string;
  let cid: string;
  beforeAll(async () => {
    sid = await newSession();
    const res = await call("POST", `/process/session/${sid}/exec`, { command: MIXED }, V0111);
    cid = res.json.cmdId;
  });

  it("0.111.1: text with markers", async () => {
    const res = await call("GET", `/process/session/${sid}/command/${cid}/logs`, undefined, V0111);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/plain/);
    expect(demux(res.text)).toEqual({ stdout: "out1\nout2\npartial\n", stderr: "err1\n" });
  });

  it("0.25.6 and no version: text without markers", async () => {
    for (const headers of [V0256, {}]) {
      const res = await call("GET", `/process/session/${sid}/command/${cid}/logs`, undefined, headers);
      expect(res.text).not.toMatch(/[\x01\x02]/);
      expect(res.text.split("\n").sort()).toEqual(["", "err1", "out1", "out2", "partial"]);
    }
  });

  it("0.218.0 (≥ 0.167): JSON {output, stdout, stderr}", async () => {
    const res = await call("GET", `/process/session/${sid}/command/${cid}/logs`, undefined, V0218);
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    expect(res.json).toEqual({ output: expect.stringContaining(`${ERR}err1\n`), stdout: "out1\nout2\npartial\n", stderr: "err1\n" });
  });

  it("is 404 with statusCode for an unknown command", async () => {
    for (const headers of [V0111, V0218]) {
      const res = await call("GET", `/process/session/${sid}/command/nope/logs`, undefined, headers);
      expect(res.status).toBe(404);
      expect(res.json.statusCode).toBe(404);
    }
  });
});

const SLOW = "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.3; done";

describe("following logs over chunked HTTP", () => {
  it("streams while the command runs and ends when it has exited", async () => {
    const sid = await newSession();
    // The command holds its later lines until the gate opens, and the test opens it only once
    // output has come: a log sent only at the exit would never get there.
    const gate = `${f.root}/follow-${sid}.gate`;
    const held = `echo o1; echo e1 >&2; until [ -e ${gate} ]; do sleep 0.05; done; for i in 2 3; do echo o$i; echo e$i >&2; done`;
    const started = await call("POST", `/process/session/${sid}/exec`, { command: held, runAsync: true }, V0111);
    const res = await toolboxFetch(f, `/process/session/${sid}/command/${started.json.cmdId}/logs?follow=true`, { headers: V0111 });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let log = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (!log) expect((await call("POST", "/process/execute", { command: `touch ${gate}` })).status).toBe(200);
      log += decoder.decode(value, { stream: true });
    }
    expect(demux(log)).toEqual({ stdout: "o1\no2\no3\n", stderr: "e1\ne2\ne3\n" });
  });

  it("0.25.6 gets the followed log without markers", async () => {
    const sid = await newSession();
    const started = await call("POST", `/process/session/${sid}/exec`, { command: SLOW, runAsync: true }, V0256);
    const res = await toolboxFetch(f, `/process/session/${sid}/command/${started.json.cmdId}/logs?follow=true`, { headers: V0256 });
    const text = await res.text();
    expect(text.split("\n").sort()).toEqual(["", "e1", "e2", "e3", "o1", "o2", "o3"]);
  });
});

/** Opens a WebSocket to a toolbox path; resolves with its frames and close once it closes. */
function followWs(path: string, headers: Record<string, string>, prefix = PREFIXES[0]) {
  const url = `${f.url.replace(/^http/, "ws")}/api${prefix}${path}`;
  const ws = new WebSocket(url, { headers });
  const frames: Array<{ data: Buffer; binary: boolean }> = [];
  return new Promise<{ frames: typeof frames; code: number; reason: string }>((resolve, reject) => {
    ws.on("message", (data: Buffer, binary) => frames.push({ data, binary }));
    ws.on("close", (code, reason) => resolve({ frames, code, reason: reason.toString() }));
    ws.on("unexpected-response", (_req, res) => reject(Object.assign(new Error(`HTTP ${res.statusCode}`), { status: res.statusCode })));
    ws.on("error", reject);
  });
}

describe("following logs over WebSocket", () => {
  it.each(PREFIXES)("sends the marked log as binary frames and closes 1000 after the exit (%s)", async (prefix) => {
    const sid = await newSession();
    const started = await call("POST", `/process/session/${sid}/exec`, { command: SLOW, runAsync: true }, V0111);
    const result = await followWs(`/process/session/${sid}/command/${started.json.cmdId}/logs?follow=true`, { authorization: `Bearer ${f.adminKey}`, ...V0111 }, prefix);
    expect(result.code).toBe(1000);
    expect(result.frames.every((fr) => fr.binary)).toBe(true);
    expect(result.frames.length).toBeGreaterThan(1);
    expect(demux(Buffer.concat(result.frames.map((fr) => fr.data)).toString())).toEqual({ stdout: "o1\no2\no3\n", stderr: "e1\ne2\ne3\n" });
  });

  it("replays a finished command's log and closes; strips markers for 0.25.6", async () => {
    const sid = await newSession();
    const done = await call("POST", `/process/session/${sid}/exec`, { command: MIXED }, V0111);
    const path = `/process/session/${sid}/command/${done.json.cmdId}/logs?follow=true`;
    const marked = await followWs(path, { authorization: `Bearer ${f.adminKey}`, ...V0111 });
    expect(demux(Buffer.concat(marked.frames.map((fr) => fr.data)).toString())).toEqual({ stdout: "out1\nout2\npartial\n", stderr: "err1\n" });
    const plain = await followWs(path, { authorization: `Bearer ${f.adminKey}`, ...V0256 });
    expect(plain.code).toBe(1000);
    expect(Buffer.concat(plain.frames.map((fr) => fr.data)).toString()).not.toMatch(/[\x01\x02]/);
  });

  it("accepts the preview token without an API key, echoes the version subprotocol, refuses bad credentials", async () => {
    const sid = await newSession();
    const done = await call("POST", `/process/session/${sid}/exec`, { command: "echo via-token" }, V0111);
    const path = `/process/session/${sid}/command/${done.json.cmdId}/logs?follow=true`;
    const viaHeader = await followWs(path, { "x-daytona-preview-token": PREVIEW_TOKEN, ...V0111 });
    expect(Buffer.concat(viaHeader.frames.map((fr) => fr.data)).toString()).toBe(`${OUT}via-token\n`);

    // Browsers: token in the query, version as a subprotocol.
    const url = `${f.url.replace(/^http/, "ws")}/api${PREFIXES[1]}${path}&DAYTONA_SANDBOX_AUTH_KEY=${PREVIEW_TOKEN}`;
    const ws = new WebSocket(url, ["X-Daytona-SDK-Version~0.111.1"]);
    const protocol = await new Promise<string>((resolve, reject) => {
      ws.on("open", () => resolve(ws.protocol));
      ws.on("error", reject);
    });
    expect(protocol).toBe("X-Daytona-SDK-Version~0.111.1");
    ws.close();

    await expect(followWs(path, { "x-daytona-preview-token": "wrong" })).rejects.toMatchObject({ status: 401 });
    await expect(followWs(path, { authorization: "Bearer wrong" })).rejects.toMatchObject({ status: 401 });
    await expect(followWs(`/process/session/${sid}/command/nope/logs?follow=true`, { authorization: `Bearer ${f.adminKey}` })).rejects.toMatchObject({ status: 404 });
    await expect(followWs(path, { authorization: `Bearer ${f.adminKey}` }, "/toolbox/other/toolbox")).rejects.toMatchObject({ status: 404 });
  });
});
