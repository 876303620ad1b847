import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { PREFIXES, PREVIEW_TOKEN, startFixture, toolboxFetch, type Fixture } from "./test-fixture.ts";
import type { UntypedJson } from "../../casts.ts";

// Terminals through the REST toolbox: created over REST, driven over a WebSocket on the
// toolbox prefix, into a real agent's PTY.

let f: Fixture;
beforeAll(async () => {
  f = await startFixture();
});
afterAll(async () => f?.stop());

async function createPty(id: string, prefix?: string) {
  const res = await toolboxFetch(f, "/process/pty", {
    method: "POST",
    prefix,
    body: JSON.stringify({ id, cwd: f.root, envs: { GREETING: "it's $me" }, cols: 100, rows: 30, lazyStart: true }),
    headers: { "content-type": "application/json" },
  });
  return { status: res.status, body: (await res.json() as UntypedJson) };
}

/** A terminal client as the SDK's PtyHandle behaves: waits for the connected control frame. */
class Terminal {
  readonly ws: WebSocket;
  output = "";
  controls: Array<Record<string, unknown>> = [];
  readonly closed: Promise<{ code: number; reason: string }>;
  private readonly waiters: Array<() => void> = [];

  constructor(id: string, headers: Record<string, string>, prefix = PREFIXES[0], opts: { path?: string; protocols?: string[] } = {}) {
    this.ws = new WebSocket(`${f.url.replace(/^http/, "ws")}/api${prefix}${opts.path ?? `/process/pty/${id}/connect`}`, opts.protocols ?? [], { headers });
    this.ws.on("message", (data: Buffer, binary) => {
      if (binary) this.output += data.toString();
      else this.controls.push(JSON.parse(data.toString()));
      this.waiters.splice(0).forEach((w) => w());
    });
    this.closed = new Promise((resolve, reject) => {
      this.ws.on("close", (code, reason) => resolve({ code, reason: reason.toString() }));
      this.ws.on("unexpected-response", (_req, res) => reject(Object.assign(new Error(`HTTP ${res.statusCode}`), { status: res.statusCode })));
      this.ws.on("error", reject);
    });
    this.closed.catch(() => undefined);
  }

  async until(check: () => boolean, what: string): Promise<void> {
    const deadline = Date.now() + 15_000;
    while (!check()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; output so far: ${JSON.stringify(this.output)}`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 200);
      });
    }
  }

  send(text: string) {
    this.ws.send(Buffer.from(text), { binary: true });
  }
}

describe("PTY over WebSocket", () => {
  it.each(PREFIXES)("connects, runs input, echoes output and closes 1000 {exitCode:0} on exit (%s)", async (prefix) => {
    const id = `pty-ok-${prefix.length}`;
    const created = await createPty(id, prefix);
    expect(created.status).toBe(201);
    expect(created.body).toEqual({ sessionId: id });
    const t = new Terminal(id, { authorization: `Bearer ${f.adminKey}`, "x-daytona-sdk-version": "0.111.1" }, prefix);
    await t.until(() => t.controls.length > 0, "the connected frame");
    expect(t.controls[0]).toEqual({ type: "control", status: "connected" });
    t.send('echo "sum=$((40+2)) $GREETING"\n');
    await t.until(() => t.output.includes("sum=42 it's $me"), "the command's output");
    // Text frames are input too.
    t.ws.send("exit\n");
    expect(await t.closed).toEqual({ code: 1000, reason: JSON.stringify({ exitCode: 0 }) });
  });

  it("reports a non-zero exit in a 1011 close reason", async () => {
    await createPty("pty-fail");
    const t = new Terminal("pty-fail", { authorization: `Bearer ${f.adminKey}` });
    await t.until(() => t.controls.length > 0, "the connected frame");
    t.send("exit 3\n");
    const closed = await t.closed;
    expect(closed.code).toBe(1011);
    expect(JSON.parse(closed.reason)).toEqual({ exitCode: 3, exitReason: "non-zero exit" });
  });

  it("takes input from REST too, and resize; the preview token works alone", async () => {
    await createPty("pty-token");
    const t = new Terminal("pty-token", { "x-daytona-preview-token": PREVIEW_TOKEN });
    await t.until(() => t.controls.length > 0, "the connected frame");
    const resize = await toolboxFetch(f, "/process/pty/pty-token/resize", { method: "POST", body: JSON.stringify({ cols: 120, rows: 40 }), headers: { "content-type": "application/json" } });
    expect(await resize.json()).toMatchObject({ cols: 120, rows: 40, active: true });
    t.send("stty size\n");
    await t.until(() => t.output.includes("40 120"), "the new size");
    const killed = await toolboxFetch(f, "/process/pty/pty-token", { method: "DELETE" });
    expect(killed.status).toBeLessThan(300);
    expect((await t.closed).code).toBe(1011);
  });

  it("create-connect (SDK 0.2xx): envs in a subprotocol, the exit as a control frame before the close", async () => {
    const envs = Buffer.from(JSON.stringify({ FROM_PROTOCOL: "yes it's" })).toString("base64url");
    const t = new Terminal("pty-cc", { authorization: `Bearer ${f.adminKey}` }, PREFIXES[1], {
      path: `/process/pty/create-connect?id=pty-cc&cols=70&rows=20&cwd=${encodeURIComponent(f.root)}`,
      protocols: [`X-Daytona-Pty-Envs~${envs}`, "X-Daytona-Pty-Exit-Control"],
    });
    await t.until(() => t.controls.length > 0, "the connected frame");
    expect(t.ws.protocol).toBe("X-Daytona-Pty-Exit-Control");
    t.send('echo "$FROM_PROTOCOL $(pwd)"; stty size\n');
    await t.until(() => t.output.includes(`yes it's ${f.root}`) && t.output.includes("20 70"), "the envs, cwd and size");
    t.send("exit 9\n");
    const closed = await t.closed;
    expect(t.controls.at(-1)).toEqual({ type: "control", status: "exited", exitCode: 9, exitReason: "non-zero exit" });
    expect(closed.code).toBe(1011);
    const dup = new Terminal("pty-cc2", { authorization: `Bearer ${f.adminKey}` }, PREFIXES[0], { path: "/process/pty/create-connect?id=&cols=70" });
    await expect(dup.closed).rejects.toMatchObject({ status: 400 });
  });

  it("refuses an unknown terminal and bad credentials before the upgrade", async () => {
    await expect(new Terminal("nope", { authorization: `Bearer ${f.adminKey}` }).closed).rejects.toMatchObject({ status: 404 });
    await createPty("pty-auth");
    await expect(new Terminal("pty-auth", { authorization: "Bearer wrong" }).closed).rejects.toMatchObject({ status: 401 });
    await expect(new Terminal("pty-auth", { "x-daytona-preview-token": "wrong" }).closed).rejects.toMatchObject({ status: 401 });
  });
});
