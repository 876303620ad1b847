import { describe, expect, it } from "vitest";
import { addressKey, DEFAULT_LOGIN_THROTTLE, LoginThrottle } from "./login-throttle.ts";

// The throttle's counting on its in-memory store (the same limiters the PostgreSQL store runs;
// test/identity/login-throttle.test.ts drives both through the login page of real servers).

/** `n` failed attempts (begun, never succeeded). */
async function fail(t: LoginThrottle, account: string, address: string, n = 1) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(await t.begin(account, address));
  return out;
}

describe("login throttle", () => {
  it("refuses a login from one address after ten failures, and only from that address", async () => {
    const t = new LoginThrottle();
    const tries = await fail(t, "ada", "198.51.100.1", 10);
    expect(tries.every((a) => !a.refused)).toBe(true);
    expect(await t.begin("ada", "198.51.100.1")).toMatchObject({ refused: true, retryAfterMs: expect.any(Number) });
    // The same login from anywhere else is still checked (slowed, not refused).
    expect(await t.begin("ada", "203.0.113.7")).toMatchObject({ refused: false });
    // Another login from the throttled address too (the address has 10 of its 30).
    expect(await t.begin("bob", "198.51.100.1")).toMatchObject({ refused: false });
    expect(await t.addressRefusedFor("198.51.100.1")).toBe(0);
  });

  it("refuses an address after thirty failures across logins", async () => {
    const t = new LoginThrottle();
    for (let i = 0; i < DEFAULT_LOGIN_THROTTLE.addressLimit; i++) expect((await t.begin(`user-${i}`, "198.51.100.2")).refused).toBe(false);
    expect(await t.addressRefusedFor("198.51.100.2")).toBeGreaterThan(0);
    expect((await t.begin("someone-new", "198.51.100.2")).refused).toBe(true);
    expect(await t.addressRefusedFor("198.51.100.3")).toBe(0);
  });

  it("slows a login by its failures from every address: none at first, then doubling, bounded", async () => {
    const t = new LoginThrottle();
    const delays = [];
    for (let i = 0; i < 12; i++) {
      const a = await t.begin("ada", `198.51.100.${10 + i}`);
      expect(a.refused).toBe(false);
      if (!a.refused) delays.push(a.delayMs);
    }
    expect(delays).toEqual([0, 0, 0, 0, 0, 250, 500, 1000, 2000, 4000, 4000, 4000]);
    // Other logins are not slowed by ada's failures.
    expect(await t.begin("bob", "198.51.100.10")).toEqual({ refused: false, delayMs: 0 });
  });

  it("takes back a successful attempt and forgets the pair's failures, not the address's or the login's", async () => {
    const t = new LoginThrottle(undefined, { pairLimit: 3, addressLimit: 5, freeFailures: 0, baseDelayMs: 100 });
    await fail(t, "ada", "198.51.100.1", 2);
    await t.begin("ada", "198.51.100.1");
    await t.succeeded("ada", "198.51.100.1");
    // The pair starts again: three more attempts pass.
    expect((await fail(t, "ada", "198.51.100.1", 3)).every((a) => !a.refused)).toBe(true);
    // The address counted 2 + 3 failures (the success was taken back): at its limit of 5.
    expect(await t.addressRefusedFor("198.51.100.1")).toBeGreaterThan(0);
    // The login's slowdown still counts its 5 failures.
    expect(await t.begin("ada", "203.0.113.1")).toEqual({ refused: false, delayMs: 3200 });
  });

  it("counts concurrent attempts as they start: a burst cannot overshoot the limit", async () => {
    const t = new LoginThrottle();
    const burst = await Promise.all(Array.from({ length: 25 }, () => t.begin("ada", "198.51.100.9")));
    expect(burst.filter((a) => !a.refused)).toHaveLength(10);
  });

  it("counts an IPv6 host by its /64", () => {
    expect(addressKey("2001:db8:1:2:3:4:5:6")).toBe("2001:db8:1:2::/64");
    expect(addressKey("2001:db8:1:2::9")).toBe("2001:db8:1:2::/64");
    expect(addressKey("2001:DB8:0001:0002:ffff::1")).toBe("2001:db8:1:2::/64");
    expect(addressKey("::1")).toBe("0:0:0:0::/64");
    expect(addressKey("64:ff9b::192.0.2.1")).toBe("64:ff9b:0:0::/64");
    expect(addressKey("fe80::1%eth0")).toBe("fe80:0:0:0::/64");
    expect(addressKey("198.51.100.1")).toBe("198.51.100.1");
    expect(addressKey("")).toBe("");
  });
});
