import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { run } from "./command.ts";
import { LinuxProvider } from "../linux/provider.ts";
import type { NetworkLease } from "./network.ts";
import { type FakeInternet, fakeInternet } from "../linux/testing/fake-internet.ts";
import type { Fixture } from "../linux/testing/harness.ts";
import { fixture, leftovers, sh, uniqueId } from "../linux/testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// Egress policy with real namespaces, veth pairs and nftables. No traffic leaves the machine:
// "the internet" is a network namespace this test creates (testing/fake-internet.ts). The host's
// own services are stood for by an HTTP server listening on every host address (what the control
// port and PostgreSQL do).

const PORT = 8080;
let net: FakeInternet;
let INET: string; // the "internet" side of the test veth
let HOST_ON_INET: string; // the host's side: a host address
let FAR: string; // a second "internet" address, routed via INET
let METADATA: string; // 169.254.169.254, as a cloud puts it, here inside the test's "internet"

let f: Fixture;
let hostServer: http.Server;
let hostPort: number;
let hostAddress: string;
const allow = uniqueId("net-allow");
const full = uniqueId("net-full");
const none = uniqueId("net-none");

const ipCmd = (...args: string[]) => run("ip", args);

/** HTTP GET from inside a sandbox: the body, or `fail <curl exit code>`. */
async function get(id: string, host: string, port = PORT): Promise<string> {
  const res = await sh(f.provider, id, `curl -s -m 1.5 http://${host}:${port}/ || echo "fail $?"`);
  return res.stdout.trim();
}

async function lease(id: string): Promise<NetworkLease> {
  return JSON.parse(await readFile(path.join(f.provider.layout.runtime(id), "network.json"), "utf8")) as NetworkLease;
}

/** What of a sandbox's network is still on the host (netns, veth, nft chain or map element). */
async function networkLeftovers(l: NetworkLease): Promise<string[]> {
  const found: string[] = [];
  if (l.netns && existsSync(`/run/netns/${l.netns}`)) found.push(`netns ${l.netns}`);
  if ((await ipCmd("-o", "link", "show").then((r) => r.stdout)).includes(` ${l.hostIf}@`)) found.push(`link ${l.hostIf}`);
  const table = (await run("nft", ["list", "table", "inet", "sandbar"])).stdout;
  if (new RegExp(`chain s${l.slot} \\{`).test(table)) found.push(`chain s${l.slot}`);
  if (table.includes(`"${l.hostIf}" : jump`)) found.push(`map element ${l.hostIf}`);
  return found;
}

beforeAll(async () => {
  net = await fakeInternet(PORT);
  ({ inet: INET, hostSide: HOST_ON_INET, far: FAR, metadata: METADATA } = net);
  // The host's services: every host address.
  hostServer = http.createServer((_q, s) => s.end("host"));
  await new Promise<void>((r) => hostServer.listen(0, "0.0.0.0", r));
  hostPort = (hostServer.address() as AddressInfo).port;
  const addrs = (await ipCmd("-4", "-o", "addr", "show")).stdout.split("\n").map((l) => /inet (\d+\.\d+\.\d+\.\d+)\//.exec(l)?.[1]);
  hostAddress = addrs.find((a) => a && !a.startsWith("127.") && !a.startsWith("198.1") && !a.startsWith("10.213.")) ?? HOST_ON_INET;

  f = await fixture();
  // The allow list names everything forbidden too: the refusals hold whatever it says.
  const allowList = [`${INET}/32`, `${HOST_ON_INET}/32`, "169.254.0.0/16", "10.213.0.0/16", `${hostAddress}/32`, "127.0.0.0/8"];
  await f.provider.create(f.spec(allow, { network: "allow-list", networkAllowList: allowList }));
  await f.provider.create(f.spec(full, { network: "full" }));
  await f.provider.create(f.spec(none, { network: "none" }));
  await Promise.all([f.provider.start(allow), f.provider.start(full), f.provider.start(none)]);
  // A service inside the "full" sandbox, on its own address: nobody else may reach it.
  await sh(f.provider, full, `setsid python3 -m http.server ${PORT} --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null &`);
}, 60_000);

afterAll(async () => {
  await disposeFixture(f, [allow, full, none]);
  hostServer?.close();
  await net?.close();
});

describe("sandbox egress policy (veth + NAT + nftables in the host namespace)", () => {
  it("an allow-list sandbox reaches the allowed address and nothing else", async () => {
    expect(await get(allow, INET)).toBe(`inet ${INET}`);
    expect(await get(allow, FAR)).toMatch(/^fail /);
  });

  it("never reaches the host, whatever its allow list says: every host address, the gateway, the host's loopback", async () => {
    const l = await lease(allow);
    for (const host of [hostAddress, HOST_ON_INET, l.gateway]) expect(await get(allow, host, hostPort), host).toMatch(/^fail /);
    // 127.0.0.1 inside is the sandbox's own loopback: the host's port is not there.
    expect(await get(allow, "127.0.0.1", hostPort)).toMatch(/^fail /);
    // And the host side is reachable from the host itself (the server is real).
    expect(await (await fetch(`http://${hostAddress}:${hostPort}/`)).text()).toBe("host");
  });

  it("never reaches the metadata range, even when allow-listed", async () => {
    expect(await get(allow, METADATA)).toMatch(/^fail /);
    expect(await get(full, METADATA)).toMatch(/^fail /);
  });

  it("a full-egress sandbox reaches any outside address but never another sandbox", async () => {
    expect(await get(full, INET)).toBe(`inet ${INET}`);
    expect(await get(full, FAR)).toBe(`inet ${FAR}`);
    const fullLease = await lease(full);
    // The service in `full` is up (reached from inside itself) ...
    expect(await sh(f.provider, full, `curl -s -m 2 -o /dev/null -w '%{http_code}' http://127.0.0.1:${PORT}/`).then((r) => r.stdout)).toBe("200");
    // ... and not from another sandbox, though the allow list names the whole sandbox subnet.
    expect(await get(allow, fullLease.address)).toMatch(/^fail /);
    expect(await get(full, (await lease(allow)).address)).toMatch(/^fail /);
  });

  it("a loopback-only sandbox (networkBlockAll) has only lo and reaches nothing", async () => {
    const links = await sh(f.provider, none, "ip -o link show | cut -d: -f2");
    expect(links.stdout.trim().split("\n").map((s) => s.trim())).toEqual(["lo"]);
    expect(await get(none, INET)).toMatch(/^fail /);
    expect(existsSync(path.join(f.provider.layout.runtime(none), "network.json"))).toBe(false);
  });

  it("gives a sandbox with egress the host's upstream resolvers", async () => {
    const conf = (await sh(f.provider, allow, "cat /etc/resolv.conf")).stdout;
    const host = await readFile("/etc/resolv.conf", "utf8");
    const upstream = [...host.matchAll(/^nameserver\s+(\d+\.\d+\.\d+\.\d+)/gm)].map((m) => m[1]).filter((a) => !a.startsWith("127."));
    expect(conf.trim().split("\n")).toEqual(upstream.slice(0, 3).map((a) => `nameserver ${a}`));
    // Read-only for the sandbox, and not the snapshot's file.
    expect((await sh(f.provider, allow, "echo x >> /etc/resolv.conf")).code).not.toBe(0);
  });

  it("the sandbox cannot change its own network or the host's rules", async () => {
    const res = await sh(f.provider, full, "ip addr add 10.9.9.9/32 dev eth0; ip link set eth0 down; nft flush ruleset; echo done");
    expect(res.stderr).toMatch(/Operation not permitted|not permitted|Permission denied|not found/);
    expect(await get(full, INET)).toBe(`inet ${INET}`);
  });

  it("updates the policy of a running sandbox without a restart", async () => {
    const before = await f.provider.inspect(allow);
    expect(await f.provider.updateNetwork(allow, "allow-list", [`${FAR}/32`])).toBe(true);
    expect(await get(allow, FAR)).toBe(`inet ${FAR}`);
    expect(await get(allow, INET)).toMatch(/^fail /);
    expect(await f.provider.updateNetwork(allow, "none")).toBe(true);
    expect(await get(allow, FAR)).toMatch(/^fail /);
    const after = await f.provider.inspect(allow);
    expect(after.startedAt).toEqual(before.startedAt);
    expect(after.spec.network).toBe("none");
    // Kept for the next start.
    expect(await f.provider.updateNetwork(allow, "allow-list", [`${INET}/32`])).toBe(true);
    expect(await get(allow, INET)).toBe(`inet ${INET}`);
  });

  it("gives a sandbox started loopback-only egress while it runs, and takes it back on stop", async () => {
    const before = await f.provider.inspect(none);
    expect(await f.provider.updateNetwork(none, "allow-list", [`${INET}/32`])).toBe(true);
    expect(await get(none, INET)).toBe(`inet ${INET}`);
    expect(await get(none, FAR)).toMatch(/^fail /);
    expect(await get(none, hostAddress, hostPort)).toMatch(/^fail /);
    const attached = await lease(none);
    expect(attached.netns).toBe("");
    expect(await f.provider.updateNetwork(none, "none")).toBe(true);
    expect(await get(none, INET)).toMatch(/^fail /);
    expect((await f.provider.inspect(none)).startedAt).toEqual(before.startedAt);
    await f.provider.stop(none);
    expect(await networkLeftovers(attached)).toEqual([]);
    // Stopped: recorded for the next start, which makes its namespace as for any sandbox with egress.
    expect(await f.provider.updateNetwork(none, "full")).toBe(false);
    await f.provider.start(none);
    expect(await get(none, FAR)).toBe(`inet ${FAR}`);
    expect((await lease(none)).netns).not.toBe("");
  });

  it("rejects bad allow lists", async () => {
    await expect(f.provider.updateNetwork(allow, "allow-list", ["10.0.0.0"])).rejects.toThrow(/not an IPv4 CIDR/);
    await expect(f.provider.updateNetwork(allow, "allow-list", ["300.0.0.0/8"])).rejects.toThrow(/not an IPv4 CIDR/);
    await expect(f.provider.create(f.spec(uniqueId("x"), { network: "allow-list", networkAllowList: ["1.2.3.4/33"] }))).rejects.toThrow(/not an IPv4 CIDR/);
  });

  it("a runner restarted while sandboxes run keeps their leases and undoes them on stop", async () => {
    const again = await LinuxProvider.open({ dataDir: f.dataDir, uidBase: (await f.provider.inspect(allow)).hostUid - 10, uidCount: 1024 });
    const held = await lease(allow);
    const extra = uniqueId("net-extra");
    try {
      await again.create(f.spec(extra, { network: "full" }));
      await again.start(extra);
      const fresh = await lease(extra);
      expect(fresh.slot).not.toBe(held.slot);
      expect(fresh.slot).not.toBe((await lease(full)).slot);
      expect((await sh(again, extra, `curl -s -m 1.5 http://${INET}:${PORT}/`)).stdout).toBe(`inet ${INET}`);
      // The restarted runner rewrote the static rules: the running sandboxes' policies still hold.
      expect(await get(allow, INET)).toBe(`inet ${INET}`);
      expect(await get(allow, FAR)).toMatch(/^fail /);
      await again.stop(extra);
      expect(await networkLeftovers(fresh)).toEqual([]);
    } finally {
      await again.destroy(extra);
      await again.close();
    }
  });

  it("removes the netns, veth and rules on stop, restores them on start, and leaves nothing on destroy", async () => {
    const first = await lease(full);
    expect(await networkLeftovers(first)).toHaveLength(4);
    await f.provider.stop(full, { force: true });
    expect(await networkLeftovers(first)).toEqual([]);
    await f.provider.start(full);
    const second = await lease(full);
    expect(await networkLeftovers(second)).toHaveLength(4);
    expect(await get(full, INET)).toBe(`inet ${INET}`);
    const hostUid = (await f.provider.inspect(full)).hostUid;
    await f.provider.destroy(full);
    expect(await networkLeftovers(second)).toEqual([]);
    expect(await leftovers(f.provider, full, hostUid)).toEqual([]);
  });
});
