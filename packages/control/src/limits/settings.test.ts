import { describe, expect, it } from "vitest";
import { DEFAULT_LIMITS, loadRateLimitSettings } from "./settings.ts";

describe("rate-limit settings", () => {
  it("default to the spec's figures, a 60 s window, memory with the embedded database and PostgreSQL with an external one", () => {
    expect(loadRateLimitSettings({})).toEqual({ store: "memory", windowSeconds: 60, limits: DEFAULT_LIMITS });
    expect(DEFAULT_LIMITS).toMatchObject({ anonymous: 600, authenticated: 50_000, "sandbox-create": 600, "sandbox-lifecycle": 50_000 });
    expect(loadRateLimitSettings({ DATABASE_URL: "postgresql://db/x" }).store).toBe("postgres");
    expect(loadRateLimitSettings({ DATABASE_URL: "postgresql://db/x", SANDBAR_RATE_LIMIT_STORE: "memory" }).store).toBe("memory");
  });

  it("read every counter and the window; 0 is unlimited", () => {
    const s = loadRateLimitSettings({
      SANDBAR_RATE_LIMIT_ANONYMOUS: "1",
      SANDBAR_RATE_LIMIT_AUTHENTICATED: "2",
      SANDBAR_RATE_LIMIT_SANDBOX_CREATE: "3",
      SANDBAR_RATE_LIMIT_SANDBOX_LIFECYCLE: "4",
      SANDBAR_RATE_LIMIT_FAILED_AUTH: "0",
      SANDBAR_RATE_LIMIT_WINDOW_SECONDS: "5",
    });
    expect(s).toEqual({ store: "memory", windowSeconds: 5, limits: { anonymous: 1, authenticated: 2, "sandbox-create": 3, "sandbox-lifecycle": 4, "failed-auth": 0 } });
  });

  it("refuse what is not a count, naming the variable", () => {
    expect(() => loadRateLimitSettings({ SANDBAR_RATE_LIMIT_AUTHENTICATED: "-1" })).toThrow(/SANDBAR_RATE_LIMIT_AUTHENTICATED must be a whole number >= 0/);
    expect(() => loadRateLimitSettings({ SANDBAR_RATE_LIMIT_SANDBOX_CREATE: "1.5" })).toThrow(/SANDBAR_RATE_LIMIT_SANDBOX_CREATE/);
    expect(() => loadRateLimitSettings({ SANDBAR_RATE_LIMIT_WINDOW_SECONDS: "0" })).toThrow(/SANDBAR_RATE_LIMIT_WINDOW_SECONDS/);
    expect(() => loadRateLimitSettings({ SANDBAR_RATE_LIMIT_STORE: "redis" })).toThrow(/SANDBAR_RATE_LIMIT_STORE must be "memory" or "postgres"/);
  });
});
