import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { hostname } from "node:os";
import { describe, expect, it } from "vitest";
import { checkDestination, connectRefusal, embeddedIPv4, guardedLookup, isInternalAddress, urlProblem } from "./destinations.ts";
import { loadWebhookSettings, parseDuration } from "./settings.ts";
import { hostAddresses, inUrl, literally } from "./testing/host-addresses.ts";

// The destination policy on its own (no server): which addresses are internal, which URLs are
// refused and with what message, and the lookup that delivery connects through.

describe("webhook destinations", () => {
  it("treats loopback, private, link-local, unique-local, unspecified, mapped and metadata addresses as internal", () => {
    for (const a of [
      "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "169.254.169.254", "0.0.0.0",
      "100.100.100.200", "224.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:7f00:1", "64:ff9b::a00:1",
    ]) expect(isInternalAddress(a), a).toBe(true);
    for (const a of ["8.8.8.8", "1.1.1.1", "172.32.0.1", "192.169.0.1", "2606:4700:4700::1111", "2001:4860:4860::8888"]) expect(isInternalAddress(a), a).toBe(false);
  });

  it("refuses bad and internal URLs with a message naming the field, unless private destinations are allowed", () => {
    expect(urlProblem("not a url", false)).toBe("url must be a valid URL");
    expect(urlProblem("ftp://example.com/x", false)).toBe("url must use http or https");
    expect(urlProblem("https://user:pw@example.com/x", false)).toBe("url must not contain a user name or password");
    expect(urlProblem("https://example.com/" + "a".repeat(2100), false)).toMatch(/^url must be shorter than or equal to 2048 characters/);
    for (const u of ["http://127.0.0.1:8080/x", "http://[::1]/x", "http://169.254.169.254/latest/meta-data", "http://10.0.0.5/", "http://[fd00:ec2::254]/", "http://localhost/x", "http://api.localhost/x", "http://0x7f000001/", "http://2130706433/"]) {
      expect(urlProblem(u, false), u).toMatch(/^url must not point at an internal address \(.*\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true/);
      expect(urlProblem(u, true), u).toBeUndefined();
    }
    expect(urlProblem("https://hooks.example.com/x", false)).toBeUndefined();
    expect(urlProblem("http://8.8.8.8/x", false)).toBeUndefined();
  });

  it("judges IPv6 forms that carry an IPv4 address by that address, whatever way the URL writes it", () => {
    expect(embeddedIPv4("::ffff:127.0.0.1")).toBe("127.0.0.1");
    expect(embeddedIPv4("::ffff:7f00:1")).toBe("127.0.0.1");
    expect(embeddedIPv4("::7f00:1")).toBe("127.0.0.1"); // compatible (deprecated)
    expect(embeddedIPv4("0:0:0:0:0:ffff:10.0.0.1")).toBe("10.0.0.1");
    expect(embeddedIPv4("::ffff:0:a00:1")).toBe("10.0.0.1"); // translated
    for (const a of ["::1", "::", "2606:4700:4700::1111", "64:ff9b::a00:1", "1::ffff:7f00:1"]) expect(embeddedIPv4(a), a).toBeUndefined();
    for (const a of ["::7f00:1", "::127.0.0.1", "::ffff:0:7f00:1", "::a9fe:a9fe", "::ffff:169.254.169.254", "64:ff9b:1::a00:1", "2002:a00:1::1", "2002:808:808::1"]) expect(isInternalAddress(a), a).toBe(true);
    for (const a of ["::ffff:8.8.8.8", "::808:808"]) expect(isInternalAddress(a), a).toBe(false);
    for (const u of [
      "http://[::127.0.0.1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:10.0.0.1]/", "http://[::ffff:0:127.0.0.1]/",
      "http://[::a9fe:a9fe]/latest/meta-data/", "http://[64:ff9b::10.0.0.1]/", "http://[64:ff9b::192.168.1.1]/", "http://[2002:c0a8:101::1]/", "http://[2002:7f00:1::]/",
      // IPv4 in decimal, octal, hex and short forms: the URL parser writes them dotted before the check.
      "http://2130706433/", "http://0x7f.1/", "http://0177.0.0.1/", "http://127.1/", "http://0/",
    ]) expect(urlProblem(u, false), u).toMatch(/^url must not point at an internal address \(.*\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true/);
    expect(urlProblem("http://[::ffff:127.0.0.1]/", false)).toBe("url must not point at an internal address (::ffff:7f00:1, IPv4 127.0.0.1); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true to allow internal destinations");
    expect(urlProblem("http://[::ffff:8.8.8.8]/", false)).toBeUndefined();
  });

  it("refuses every address of this host's own interfaces, private range or not (and their IPv6 forms), unless private destinations are allowed", () => {
    const own = hostAddresses();
    expect(own.length, "this test needs an interface besides loopback").toBeGreaterThan(0);
    for (const a of own) {
      const u = `http://${inUrl(a)}:8080/hook`;
      const expected = isInternalAddress(a) ? "an internal address" : "an address of this server";
      expect(urlProblem(u, false), u).toMatch(new RegExp(`^url must not point at ${expected} \\(${literally(a)}(, IPv4 [0-9.]+)?\\); set SANDBAR_WEBHOOK_ALLOW_PRIVATE=true`));
      expect(urlProblem(u, true), u).toBeUndefined();
      if (isIP(a) === 4) {
        for (const v6 of [`::ffff:${a}`, `::${a}`, `::ffff:0:${a}`]) expect(urlProblem(`http://[${v6}]/`, false), v6).toMatch(new RegExp(`^url must not point at ${expected} \\(.*, IPv4 ${literally(a)}\\)`));
      }
    }
  });

  it("refuses, at connection time, addresses of this host: the check delivery applies to what a name resolved to", () => {
    for (const a of hostAddresses()) {
      const why = connectRefusal("hooks.example.com", ["2606:4700:4700::1111", a], false);
      expect(why, a).toMatch(new RegExp(`^destination hooks\\.example\\.com resolves to (an internal address|an address of this server) \\(${literally(a)}\\)$`));
      expect(connectRefusal(a, [a], false), a).toMatch(/^destination .* is (an internal address|an address of this server)$/);
      expect(connectRefusal("hooks.example.com", [a], true), a).toBeUndefined();
    }
    expect(connectRefusal("hooks.example.com", ["8.8.8.8", "2606:4700:4700::1111"], false)).toBeUndefined();
    expect(connectRefusal("hooks.example.com", ["::ffff:10.1.2.3"], false)).toBe("destination hooks.example.com resolves to an internal address (::ffff:10.1.2.3, IPv4 10.1.2.3)");
  });

  it("resolves names on create: a name resolving inside the network is refused, one that does not resolve (yet) is accepted", async () => {
    expect(await checkDestination("http://localhost./x", false)).toMatch(/internal address/);
    // This machine's own name resolves to a loopback address (/etc/hosts): refused by resolution, not by name.
    const own = await lookup(hostname(), { all: true });
    expect(own.every((a) => isInternalAddress(a.address)), "this test needs the host name to resolve to loopback").toBe(true);
    expect(await checkDestination(`http://${hostname()}:8080/x`, false)).toMatch(new RegExp(`^url host ${hostname()} resolves to an internal address \\(`));
    expect(await checkDestination(`http://${hostname()}:8080/x`, true)).toBeUndefined();
    expect(await checkDestination("https://no-such-host.invalid/x", false)).toBeUndefined();
  });

  it("refuses, at connection time, a name that resolves to an internal address", async () => {
    const lookup = guardedLookup(false);
    const err = await new Promise<Error | null>((resolve) => lookup("localhost", { all: true }, (e) => resolve(e)));
    expect(err?.message).toMatch(/^destination localhost resolves to an internal address \((127\.0\.0\.1|::1)\)$/);
    const ok = await new Promise<unknown>((resolve) => guardedLookup(true)("localhost", { all: true }, (e, a) => resolve(e ?? a)));
    expect(Array.isArray(ok) && ok.length > 0).toBe(true);
  });

  it("reads its settings, refusing malformed values", () => {
    expect(parseDuration("X", "5s")).toBe(5000);
    expect(parseDuration("X", "250ms")).toBe(250);
    expect(parseDuration("X", "2h")).toBe(7_200_000);
    const s = loadWebhookSettings({});
    expect(s).toMatchObject({ allowPrivate: false, timeoutMs: 15_000, disableAfterMs: 86_400_000 });
    expect(s.retryDelaysMs).toEqual([5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 50_400_000]);
    expect(loadWebhookSettings({ SANDBAR_WEBHOOK_ALLOW_PRIVATE: "true", SANDBAR_WEBHOOK_RETRY_SCHEDULE: "100ms,1s" })).toMatchObject({ allowPrivate: true, retryDelaysMs: [100, 1000] });
    expect(() => loadWebhookSettings({ SANDBAR_WEBHOOK_ALLOW_PRIVATE: "yes please" })).toThrow(/SANDBAR_WEBHOOK_ALLOW_PRIVATE must be true or false/);
    expect(() => loadWebhookSettings({ SANDBAR_WEBHOOK_RETRY_SCHEDULE: "5 minutes" })).toThrow(/SANDBAR_WEBHOOK_RETRY_SCHEDULE must be durations/);
    expect(() => loadWebhookSettings({ SANDBAR_WEBHOOK_TIMEOUT_MS: "5" })).toThrow(/at least 100 ms/);
  });
});
