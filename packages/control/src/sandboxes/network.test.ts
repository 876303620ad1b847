import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { networkInterfaces } from "node:os";
import { connect, type Socket } from "node:net";
import path from "node:path";
import { type FakeInternet, fakeInternet } from "@sandbar/runner/testing/fake-internet";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type SandboxDto, type SandboxFixture, sandboxFixture } from "./testing/fixtures.ts";

// Network policy through the API with real sandboxes, namespaces and nftables: the create fields,
// POST /sandbox/{id}/network-settings, and what a sandbox can reach. "The internet" is a namespace
// the test makes (no traffic leaves the machine); the server listens on every host address here,
// so the control port and PostgreSQL are there to be tried from inside the sandboxes.

let f: SandboxFixture;
let net: FakeInternet;
let pgPort: number;
let hostAddress: string;
let controlPort: number;

// A TCP probe run by the sandbox's node: the HTTP body, or "fail <why>".
const PROBE = `const [h, p] = process.argv.slice(2); const s = require("net").connect({ host: h, port: +p, timeout: 1500 });
let b = ""; s.on("connect", () => s.end("GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")); s.on("data", (d) => (b += d));
s.on("end", () => console.log(b.split("\\r\\n\\r\\n")[1] ?? "open")); s.on("timeout", () => { console.log("fail timeout"); process.exit(); });
s.on("error", (e) => { console.log("fail " + e.code); process.exit(); });`;

async function reach(id: string, host: string, port: number): Promise<string> {
  const b64 = Buffer.from(PROBE).toString("base64");
  const r = await f.exec(id, `echo ${b64} | base64 -d > /tmp/probe.js && /opt/sandbar/bin/node /tmp/probe.js ${host} ${port}`);
  return r.result.trim();
}

/** The sandbox's address on its veth (the runner's lease), or "none" when it has loopback only. */
async function sandboxAddress(id: string): Promise<string> {
  const lease = await readFile(path.join(f.runtime.provider.layout.runtime(id), "network.json"), "utf8").catch(() => undefined);
  return lease ? (JSON.parse(lease) as { address: string }).address : "none";
}

beforeAll(async () => {
  net = await fakeInternet(8080);
  f = await sandboxFixture({ host: "0.0.0.0" });
  controlPort = Number(new URL(f.t.url).port);
  pgPort = Number(new URL(f.t.server.orm.config.get("clientUrl") ?? "postgres://x:1/").port) || Number(f.t.server.orm.config.get("port"));
  hostAddress = Object.values(networkInterfaces()).flat().find((a) => a && a.family === "IPv4" && !a.internal && !a.address.startsWith("198.1") && !a.address.startsWith("10.213."))?.address ?? net.hostSide;
}, 120_000);

afterAll(async () => {
  await f?.stop();
  await net?.close();
});

describe("network policy through the API", () => {
  it("refuses bad allow lists with the reference's messages", async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ networkAllowList: "10.0.0.0" }, 'Invalid network format: "10.0.0.0". Missing CIDR prefix length (e.g., /24)'],
      [{ networkAllowList: "10.0.0.300/8" }, 'Invalid IP address: "10.0.0.300" in network "10.0.0.300/8". Must be a valid IPv4 address'],
      [{ networkAllowList: "10.0.0.0/33" }, "Invalid CIDR prefix length: 10.0.0.0/33. Prefix must be between 0 and 32"],
      [{ networkAllowList: Array.from({ length: 11 }, (_, i) => `10.0.${i}.0/24`).join(",") }, "Network allow list cannot contain more than 10 networks"],
      [{ domainAllowList: "not a domain" }, 'Invalid domain: "not a domain". Must be a valid domain name'],
      [{ domainAllowList: "pypi.org" }, "domainAllowList is not supported by this server"],
      // Not network policy, but refused the same way rather than dropped: the sandbox would run without them.
      [{ secrets: [{ OPENAI_API_KEY: "openai" }] }, "secrets are not supported by this server yet"],
    ];
    for (const [body, message] of cases) {
      const res = await f.call("POST", "/sandbox", body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(JSON.stringify(res.body)).toContain(JSON.stringify(message).slice(1, -1));
    }
  });

  let a: SandboxDto;
  let b: SandboxDto;

  it("an allow-list sandbox reaches only the allowed address; never the control port, PostgreSQL or the host", async () => {
    // The list names the host and the sandbox subnet too: refused whatever it says.
    a = await f.create({ networkAllowList: `${net.inet}/32, ${hostAddress}/32,10.213.0.0/16` });
    expect(a.state).toBe("started");
    expect(a.networkBlockAll).toBe(false);
    expect(a.networkAllowList).toBe(`${net.inet}/32,${hostAddress}/32,10.213.0.0/16`);
    expect(await reach(a.id, net.inet, net.port)).toBe(`inet ${net.inet}`);
    expect(await reach(a.id, net.far, net.port)).toMatch(/^fail/);
    for (const host of [hostAddress, net.hostSide, "127.0.0.1"]) {
      expect(await reach(a.id, host, controlPort), `control port on ${host}`).toMatch(/^fail/);
      expect(await reach(a.id, host, pgPort), `PostgreSQL on ${host}`).toMatch(/^fail/);
    }
    // The control port and PostgreSQL are really there (from the host).
    expect(pgPort).toBeGreaterThan(0);
    await new Promise<void>((resolve, reject) => connect(pgPort, "127.0.0.1").on("connect", function (this: Socket) {
      this.destroy();
      resolve();
    }).on("error", reject));
    expect((await fetch(`http://${hostAddress}:${controlPort}/api/config`)).status).toBeLessThan(500);
    expect((await f.call("GET", `/sandbox/${a.id}`)).body.networkAllowList).toBe(a.networkAllowList);
  });

  it("networkBlockAll and the operator's default (none) keep loopback only", async () => {
    const blocked = await f.create({ networkBlockAll: true, networkAllowList: `${net.inet}/32` });
    expect(blocked.networkBlockAll).toBe(true);
    expect(blocked.networkAllowList).toBeNull();
    expect(await reach(blocked.id, net.inet, net.port)).toMatch(/^fail/);
    const plain = await f.create({});
    expect(plain.networkBlockAll).toBe(true);
    expect(await sandboxAddress(plain.id)).toBe("none");
    expect(await reach(plain.id, net.inet, net.port)).toMatch(/^fail/);
    // Egress given to a sandbox started loopback-only, while it runs.
    const opened = await f.call("POST", `/sandbox/${plain.id}/network-settings`, { networkAllowList: `${net.far}/32` });
    expect(opened.body).toMatchObject({ networkBlockAll: false, networkAllowList: `${net.far}/32`, state: "started" });
    expect(await reach(plain.id, net.far, net.port)).toBe(`inet ${net.far}`);
    expect(await reach(plain.id, net.inet, net.port)).toMatch(/^fail/);
    for (const s of [blocked, plain]) await f.call("DELETE", `/sandbox/${s.id}`);
  });

  it("sandboxes with egress never reach each other", async () => {
    b = await f.create({ networkBlockAll: false });
    expect(b.networkBlockAll).toBe(false);
    expect(await reach(b.id, net.far, net.port)).toBe(`inet ${net.far}`);
    await f.exec(b.id, "setsid /opt/sandbar/bin/node -e 'require(\"http\").createServer((q,s)=>s.end(\"b\")).listen(8081)' >/dev/null 2>&1 < /dev/null &");
    const bAddr = await sandboxAddress(b.id);
    expect(bAddr).toMatch(/^10\.213\./);
    // The server starts in the background: wait until it listens (node's start is slow on a busy machine).
    let own = "";
    for (let i = 0; i < 50 && own !== "b"; i++) {
      own = await reach(b.id, "127.0.0.1", 8081);
      if (own !== "b") await new Promise((r) => setTimeout(r, 200));
    }
    expect(own).toBe("b");
    expect(await reach(a.id, bAddr, 8081)).toMatch(/^fail/);
    expect(await reach(b.id, await sandboxAddress(a.id), 8081)).toMatch(/^fail/);
  });

  it("POST /sandbox/{id}/network-settings changes a running sandbox's policy at once, with the reference's semantics", async () => {
    const none = await f.call("POST", `/sandbox/${a.id}/network-settings`, {});
    expect(none.status).toBe(400);
    expect(JSON.stringify(none.body)).toContain("At least one of networkBlockAll, networkAllowList or domainAllowList must be provided");
    const bad = await f.call("POST", `/sandbox/${a.id}/network-settings`, { networkAllowList: "1.2.3.4" });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body)).toContain("Missing CIDR prefix length");

    const moved = await f.call("POST", `/sandbox/${a.id}/network-settings`, { networkAllowList: `${net.far}/32` });
    expect(moved.status, JSON.stringify(moved.body)).toBe(200);
    expect(moved.body).toMatchObject({ networkBlockAll: false, networkAllowList: `${net.far}/32`, state: "started" });
    expect(await reach(a.id, net.far, net.port)).toBe(`inet ${net.far}`);
    expect(await reach(a.id, net.inet, net.port)).toMatch(/^fail/);

    const blocked = await f.call("POST", `/sandbox/${a.id}/network-settings`, { networkBlockAll: true });
    expect(blocked.body.networkBlockAll).toBe(true);
    expect(blocked.body.networkAllowList).toBeNull();
    expect(await reach(a.id, net.far, net.port)).toMatch(/^fail/);

    // Another organization's sandbox: 404, and nothing changes.
    const other = await f.otherOrganization();
    const theirs = await f.call("POST", `/sandbox/${b.id}/network-settings`, { networkBlockAll: true }, other.key);
    expect(theirs.status).toBe(404);
    expect(await reach(b.id, net.far, net.port)).toBe(`inet ${net.far}`);
  });

  it("keeps the policy across stop and start and across archive and restore, and delete leaves no namespace behind", async () => {
    await f.call("POST", `/sandbox/${b.id}/network-settings`, { networkAllowList: `${net.inet}/32` });
    await f.call("POST", `/sandbox/${b.id}/stop`);
    expect((await f.call("POST", `/sandbox/${b.id}/start`)).body.state).toBe("started");
    expect(await reach(b.id, net.inet, net.port)).toBe(`inet ${net.inet}`);
    expect(await reach(b.id, net.far, net.port)).toMatch(/^fail/);
    await f.call("POST", `/sandbox/${b.id}/stop`);
    expect((await f.call("POST", `/sandbox/${b.id}/archive`)).body.state).toBe("archived");
    expect((await f.call("POST", `/sandbox/${b.id}/start`)).body.state).toBe("started");
    expect(await reach(b.id, net.inet, net.port)).toBe(`inet ${net.inet}`);
    expect(await reach(b.id, net.far, net.port)).toMatch(/^fail/);
    const netns = f.runtime.provider.layout.key;
    for (const s of [a, b]) {
      expect((await f.call("DELETE", `/sandbox/${s.id}`)).body.state).toBe("destroyed");
      expect(existsSync(`/run/netns/sandbar-${netns}-${s.id}`)).toBe(false);
    }
  });
});
