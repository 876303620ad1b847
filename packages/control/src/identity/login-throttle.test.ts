import { describe, expect, it } from "vitest";
import { LoginThrottle } from "./login-throttle.ts";

describe("login throttle", () => {
  it("blocks a login after ten failures, per login and per address, and forgets a login on success", () => {
    const t = new LoginThrottle();
    for (let i = 0; i < 9; i++) t.failed("Ada", "10.0.0.1");
    expect(t.blocked("ada", "10.0.0.2")).toBe(false);
    t.failed("ada", "10.0.0.1");
    expect(t.blocked("ADA", "10.0.0.2")).toBe(true); // the login, from anywhere
    expect(t.blocked("bob", "10.0.0.1")).toBe(true); // the address, for any login
    expect(t.blocked("bob", "10.0.0.2")).toBe(false);
    t.succeeded("ada");
    expect(t.blocked("ada", "10.0.0.2")).toBe(false);
  });
});
