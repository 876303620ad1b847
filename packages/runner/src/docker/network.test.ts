import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { run } from "../host/command.ts";
import type { NetworkLease } from "../host/network.ts";
import { type FakeInternet, fakeInternet } from "../linux/testing/fake-internet.ts";
import { sh, uniqueId } from "../linux/testing/harness.ts";
import type { ProviderFixture } from "../testing/provider-contract.ts";
import type { DockerProvider } from "./provider.ts";
import { dockerdUnavailable, sharedDockerd } from "./testing/dockerd.ts";
import { dockerFixture } from "./testing/fixture.ts";
import { disposeFixture } from "../testing/dispose.ts";

// Egress of docker sandboxes: the container starts with the engine's network "none" and the
// provider attaches the linux provider's veth and nftables policy to its namespace (network.ts).
// "The internet" is a namespace this test creates (testing/fake-internet.ts): nothing leaves the machine.

const PORT = 8080;
const skip = dockerdUnavailable();
if (skip) console.log(`docker network suite skipped: ${skip}`);

describe.skipIf(skip !== undefined)("docker sandbox networks", () => {
  let net: FakeInternet;
  let f: ProviderFixture<DockerProvider>;
  const ids: string[] = [];

  const get = async (id: string, host: string) => (await sh(f.provider, id, `curl -s -m 1.5 http://${host}:${PORT}/ || echo "fail $?"`)).stdout.trim();
  const lease = async (id: string) => JSON.parse(await readFile(path.join(f.provider.layout.runtime(id), "network.json"), "utf8")) as NetworkLease;
  const make = async (over: Parameters<ProviderFixture["spec"]>[1]) => {
    const id = uniqueId("dnet");
    ids.push(id);
    await f.provider.create(f.spec(id, over));
    await f.provider.start(id);
    return id;
  };

  beforeAll(async () => {
    net = await fakeInternet(PORT);
    f = await dockerFixture(await sharedDockerd(inject("dockerdDir")));
  });

  afterAll(async () => {
    await net?.close();
    await disposeFixture(f, ids);
  });

  it("none has loopback only; full reaches outside but never the host; an allow list reaches only its CIDRs", async () => {
    const none = await make({ network: "none" });
    const full = await make({ network: "full" });
    const allow = await make({ network: "allow-list", networkAllowList: [`${net.inet}/32`, `${net.hostSide}/32`, "169.254.0.0/16"] });
    expect(await get(none, net.inet)).toMatch(/^fail/);
    expect(await get(full, net.inet)).toBe(`inet ${net.inet}`);
    expect(await get(full, net.far)).toBe(`inet ${net.far}`);
    expect(await get(allow, net.inet)).toBe(`inet ${net.inet}`);
    expect(await get(allow, net.far)).toMatch(/^fail/);
    // Listed or not: the host and the metadata address stay out of reach.
    expect(await get(allow, net.hostSide)).toMatch(/^fail/);
    expect(await get(full, net.metadata)).toMatch(/^fail/);
    expect(await get(allow, net.metadata)).toMatch(/^fail/);
  });

  it("updateNetwork gives a running loopback-only sandbox egress at once; stop removes its veth and rules", async () => {
    const id = await make({ network: "none" });
    expect(await get(id, net.inet)).toMatch(/^fail/);
    expect(await f.provider.updateNetwork(id, "allow-list", [`${net.inet}/32`])).toBe(true);
    expect(await get(id, net.inet)).toBe(`inet ${net.inet}`);
    expect(await get(id, net.far)).toMatch(/^fail/);
    const l = await lease(id);
    await f.provider.stop(id);
    expect((await run("ip", ["-o", "link", "show"])).stdout).not.toContain(` ${l.hostIf}@`);
    expect((await run("nft", ["list", "table", "inet", "sandbar"])).stdout).not.toContain(`"${l.hostIf}" : jump`);
    expect(existsSync(f.provider.layout.runtime(id))).toBe(false);
    // The policy is kept: the next start has it from the beginning.
    await f.provider.start(id);
    expect(await get(id, net.inet)).toBe(`inet ${net.inet}`);
    expect(await get(id, net.far)).toMatch(/^fail/);
  });
});
