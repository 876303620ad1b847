import { describe, expect, it } from "vitest";
import { loadSettings } from "../settings.ts";
import { createNetwork, parseNetworkAllowList, refuseDomainAllowList, runtimeNetwork, updateNetwork } from "./network-policy.ts";

// The policy rules on their own (the enforcement is proven with real sandboxes in network.test.ts).

describe("network allow lists", () => {
  it("accepts IPv4 CIDRs, trims entries and skips empty ones", () => {
    expect(parseNetworkAllowList(" 10.0.0.0/8, 192.168.1.1/32,,0.0.0.0/0 ")).toEqual(["10.0.0.0/8", "192.168.1.1/32", "0.0.0.0/0"]);
    expect(parseNetworkAllowList("")).toEqual([]);
  });

  it.each([
    ["10.0.0.0", 'Invalid network format: "10.0.0.0". Missing CIDR prefix length (e.g., /24)'],
    ["10.0.0.0/", 'Invalid network format: "10.0.0.0/". Missing CIDR prefix length (e.g., /24)'],
    ["256.0.0.0/8", 'Invalid IP address: "256.0.0.0" in network "256.0.0.0/8". Must be a valid IPv4 address'],
    ["01.2.3.4/8", 'Invalid IP address: "01.2.3.4" in network "01.2.3.4/8". Must be a valid IPv4 address'],
    ["::1/128", 'Invalid IP address: "::1" in network "::1/128". Must be a valid IPv4 address'],
    ["example.com/8", 'Invalid IP address: "example.com" in network "example.com/8". Must be a valid IPv4 address'],
    ["10.0.0.0/33", "Invalid CIDR prefix length: 10.0.0.0/33. Prefix must be between 0 and 32"],
    ["10.0.0.0/-1", "Invalid CIDR prefix length: 10.0.0.0/-1. Prefix must be between 0 and 32"],
    ["10.0.0.0/8x", "Invalid CIDR prefix length: 10.0.0.0/8x. Prefix must be between 0 and 32"],
    [Array.from({ length: 11 }, () => "1.1.1.1/32").join(","), "Network allow list cannot contain more than 10 networks"],
  ])("refuses %j", (list, message) => {
    expect(() => parseNetworkAllowList(list)).toThrow(message);
  });

  it("takes exactly 10", () => {
    expect(parseNetworkAllowList(Array.from({ length: 10 }, (_, i) => `10.${i}.0.0/16`).join(","))).toHaveLength(10);
  });
});

describe("domain allow lists", () => {
  it("are checked as the reference checks them, then refused", () => {
    expect(() => refuseDomainAllowList(undefined)).not.toThrow();
    expect(() => refuseDomainAllowList("")).not.toThrow();
    expect(() => refuseDomainAllowList("bad domain")).toThrow('Invalid domain: "bad domain". Must be a valid domain name');
    expect(() => refuseDomainAllowList(Array.from({ length: 11 }, (_, i) => `d${i}.example.com`).join(","))).toThrow("Domain allow list cannot contain more than 10 domains");
    expect(() => refuseDomainAllowList("*.pypi.org")).toThrow("domainAllowList is not supported by this server");
  });
});

describe("the policy of a sandbox", () => {
  it("on create: networkBlockAll=true wins, then the list, then networkBlockAll=false, then the operator's default", () => {
    expect(createNetwork(true, "1.2.3.0/24", "egress")).toEqual({ networkBlockAll: true, networkAllowList: null });
    expect(createNetwork(undefined, "1.2.3.0/24, 5.6.7.8/32", "none")).toEqual({ networkBlockAll: false, networkAllowList: "1.2.3.0/24,5.6.7.8/32" });
    expect(createNetwork(false, undefined, "none")).toEqual({ networkBlockAll: false, networkAllowList: null });
    expect(createNetwork(undefined, undefined, "none")).toEqual({ networkBlockAll: true, networkAllowList: null });
    expect(createNetwork(undefined, "", "egress")).toEqual({ networkBlockAll: false, networkAllowList: null });
  });

  it("on update: the reference's semantics", () => {
    const listed = { networkBlockAll: false, networkAllowList: "1.2.3.0/24" };
    expect(updateNetwork(listed, undefined, "")).toEqual({ networkBlockAll: false, networkAllowList: null });
    expect(updateNetwork(listed, true, undefined)).toEqual({ networkBlockAll: true, networkAllowList: null });
    expect(updateNetwork({ networkBlockAll: true, networkAllowList: null }, true, "9.9.9.9/32")).toEqual({ networkBlockAll: false, networkAllowList: "9.9.9.9/32" });
    expect(updateNetwork(listed, false, undefined)).toEqual({ networkBlockAll: false, networkAllowList: null });
    expect(updateNetwork(listed, undefined, undefined)).toEqual(listed);
  });

  it("maps to what the host enforces", () => {
    expect(runtimeNetwork({ networkBlockAll: true, networkAllowList: null })).toEqual({ mode: "none", allowList: [] });
    expect(runtimeNetwork({ networkBlockAll: false, networkAllowList: null })).toEqual({ mode: "full", allowList: [] });
    expect(runtimeNetwork({ networkBlockAll: false, networkAllowList: "1.2.3.0/24,5.6.7.8/32" })).toEqual({ mode: "allow-list", allowList: ["1.2.3.0/24", "5.6.7.8/32"] });
  });

  it("SANDBAR_SANDBOX_NETWORK is none by default, egress on request, anything else refused at start", () => {
    expect(loadSettings({}).sandboxNetwork).toBe("none");
    expect(loadSettings({ SANDBAR_SANDBOX_NETWORK: "egress" }).sandboxNetwork).toBe("egress");
    expect(() => loadSettings({ SANDBAR_SANDBOX_NETWORK: "full" })).toThrow("SANDBAR_SANDBOX_NETWORK must be none or egress");
    expect(loadSettings({ SANDBAR_SANDBOX_SUBNET: "10.50.0.0/20" }).sandboxSubnet).toBe("10.50.0.0/20");
    expect(() => loadSettings({ SANDBAR_SANDBOX_SUBNET: "10.50.0.0/28" })).toThrow("SANDBAR_SANDBOX_SUBNET must be an IPv4 CIDR of at least a /24");
    expect(() => loadSettings({ SANDBAR_SANDBOX_SUBNET: "10.50.0.0" })).toThrow("SANDBAR_SANDBOX_SUBNET must be an IPv4 CIDR");
  });
});
