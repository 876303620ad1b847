import { afterEach, describe, expect, it } from "vitest";
import { clientAddress, parseTrustedProxies, trustProxies } from "./client-address.ts";

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
});
