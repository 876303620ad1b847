import { afterEach, describe, expect, it } from "vitest";
import { loadSettings } from "../settings.ts";
import { clientAddress, declareClient, parseTrustedProxies, trustProxies } from "./client-address.ts";

const req = (remoteAddress: string, xff?: string) => ({ socket: { remoteAddress }, headers: xff === undefined ? {} : { "x-forwarded-for": xff } });

describe("client address", () => {
  afterEach(() => trustProxies([]));

  it("is the peer, whatever X-Forwarded-For says, without trusted proxies", () => {
    expect(clientAddress(req("::ffff:203.0.113.7", "198.51.100.1"))).toBe("203.0.113.7");
    expect(clientAddress(req("2001:db8::1", "198.51.100.1"))).toBe("2001:db8::1");
  });

  it("is the right-most untrusted hop behind trusted proxies (a client cannot prepend its own)", () => {
    trustProxies(parseTrustedProxies("10.0.0.0/8, 127.0.0.1"));
    expect(clientAddress(req("127.0.0.1", "6.6.6.6, 198.51.100.1, 10.1.2.3"))).toBe("198.51.100.1");
    expect(clientAddress(req("127.0.0.1"))).toBe("127.0.0.1");
    expect(clientAddress(req("203.0.113.7", "198.51.100.1"))).toBe("203.0.113.7");
  });

  it("refuses settings that are not addresses or CIDRs", () => {
    expect(() => parseTrustedProxies("10.0.0.0/33")).toThrow(/not an IP address or CIDR/);
    expect(() => parseTrustedProxies("proxy.example")).toThrow(/not an IP address or CIDR/);
    expect(parseTrustedProxies(undefined)).toEqual([]);
  });

  it("is what a PROXY header stated for the connection, in place of its peer; X-Forwarded-For still only behind trusted proxies", () => {
    const r = req("10.0.0.5", "198.51.100.1");
    declareClient(r.socket, "203.0.113.9");
    expect(clientAddress(r)).toBe("203.0.113.9");
    // A balancer stating a trusted proxy's address (an HTTP proxy behind it) lets that proxy's header count.
    trustProxies(parseTrustedProxies("192.0.2.0/24"));
    const behind = req("10.0.0.5", "6.6.6.6, 198.51.100.2");
    declareClient(behind.socket, "192.0.2.10");
    expect(clientAddress(behind)).toBe("198.51.100.2");
  });

  it("SANDBAR_PROXY_PROTOCOL_FROM: a list of addresses and CIDRs, off when unset, an entry that is neither refused by name", () => {
    expect(loadSettings({}).proxyProtocolFrom).toEqual([]);
    expect(loadSettings({ SANDBAR_PROXY_PROTOCOL_FROM: " 172.29.213.10, 10.0.0.0/8,2001:db8::/32" }).proxyProtocolFrom).toEqual(["172.29.213.10", "10.0.0.0/8", "2001:db8::/32"]);
    expect(() => loadSettings({ SANDBAR_PROXY_PROTOCOL_FROM: "lb.internal" })).toThrow('SANDBAR_PROXY_PROTOCOL_FROM: "lb.internal" is not an IP address or CIDR');
    expect(() => loadSettings({ SANDBAR_PROXY_PROTOCOL_FROM: "10.0.0.0/40" })).toThrow(/SANDBAR_PROXY_PROTOCOL_FROM/);
  });
});
