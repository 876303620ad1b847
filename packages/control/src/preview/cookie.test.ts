import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../testing/server.ts";
import { COOKIE_MAX_AGE_S, PreviewCookies } from "./cookie.ts";

// The token link's cookie, with its key kept in a real PostgreSQL (shared by control processes).

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t?.stop();
});

describe("preview cookies", () => {
  it("hold for their sandbox and current token until they expire; anything else is forged", async () => {
    const cookies = await PreviewCookies.open(t.server.orm);
    const now = Date.now();
    const value = cookies.issue("sbx-a", "token-1", now);
    expect(value).toMatch(/^[0-9]+\.[A-Za-z0-9_-]{43}$/);
    expect(value).not.toContain("token-1");
    expect(cookies.verify(value, "sbx-a", "token-1", now)).toBe("ok");
    expect(cookies.verify(value, "sbx-a", "token-1", now + COOKIE_MAX_AGE_S * 1000 + 1000)).toBe("expired");
    expect(cookies.verify(value, "sbx-b", "token-1", now)).toBe("forged"); // another sandbox's
    expect(cookies.verify(value, "sbx-a", "token-2", now)).toBe("forged"); // the token rotated
    const [expires, mac] = value.split(".");
    expect(cookies.verify(`${Number(expires) + 100000}.${mac}`, "sbx-a", "token-1", now)).toBe("forged"); // a longer life
    expect(cookies.verify("garbage", "sbx-a", "token-1", now)).toBe("forged");
    // Another process opening the same database verifies it: one key, kept once.
    const again = await PreviewCookies.open(t.server.orm);
    expect(again.verify(value, "sbx-a", "token-1", now)).toBe("ok");
  });
});
