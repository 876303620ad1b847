import { describe, expect, it } from "vitest";
import { cookieJar, jarCookies, rewriteHead, scopeSetCookie, splitHead } from "./path-form.ts";

const A = "11111111-1111-4111-8111-111111111111";
const B = "22222222-2222-4222-8222-222222222222";
const jarA = cookieJar({ id: A, port: 8000, prefix: `/api/preview-proxy/${A}/8000` });
const jarB = cookieJar({ id: B, port: 8000, prefix: `/api/preview-proxy/${B}/8000` });

describe("path-form cookies", () => {
  it("scopes an app's cookie to the preview: tagged name, no Domain, Path under the prefix", () => {
    expect(scopeSetCookie("x=1; Path=/; Domain=example.com; HttpOnly", jarA, "/info")).toBe(`${jarA.tag}x=1; HttpOnly; Path=/api/preview-proxy/${A}/8000/`);
    expect(scopeSetCookie("s=abc; path=/app; SameSite=Strict; Secure", jarA, "/")).toBe(`${jarA.tag}s=abc; SameSite=Strict; Secure; Path=/api/preview-proxy/${A}/8000/app`);
  });

  it("gives a cookie without a usable Path the default path under the prefix, never the prefix's parent", () => {
    expect(scopeSetCookie("x=1", jarA, "/a/b/c?q=1")).toBe(`${jarA.tag}x=1; Path=/api/preview-proxy/${A}/8000/a/b`);
    expect(scopeSetCookie("x=1; Path=relative", jarA, "/page")).toBe(`${jarA.tag}x=1; Path=/api/preview-proxy/${A}/8000/`);
    expect(scopeSetCookie("x=1; Path=", jarA, "/")).toBe(`${jarA.tag}x=1; Path=/api/preview-proxy/${A}/8000/`);
  });

  it("round-trips names, name-less cookies and __Host- prefixes", () => {
    const set = [scopeSetCookie("a=1", jarA, "/"), scopeSetCookie("lonely", jarA, "/"), scopeSetCookie("__Host-k=v; Secure; Path=/", jarA, "/")];
    const header = set.map((c) => c.split(";")[0]).join("; ");
    expect(jarCookies(header, jarA)).toBe("a=1; lonely; __Host-k=v");
  });

  it("forwards only the preview's own cookies: not another preview's, not the API's or the proxy's", () => {
    const header = `${jarA.tag}mine=1; ${jarB.tag}theirs=2; sandbar-preview-${A}=123.abc; session=api; mine=untagged`;
    expect(jarCookies(header, jarA)).toBe("mine=1");
    expect(jarCookies(header, jarB)).toBe("theirs=2");
    expect(jarCookies("session=api", jarA)).toBeUndefined();
    expect(jarA.tag).not.toBe(cookieJar({ id: A, port: 8001, prefix: "" }).tag);
  });

  it("rewrites an upgrade answer's head and keeps the bytes after it", () => {
    const raw = Buffer.from("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nset-cookie: w=1; Domain=x; Path=/\r\n\r\n\x81\x02hi", "latin1");
    const split = splitHead(raw)!;
    expect(split.rest.toString("latin1")).toBe("\x81\x02hi");
    expect(rewriteHead(split.head, jarA, "/ws")).toBe(
      `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSet-Cookie: ${jarA.tag}w=1; Path=/api/preview-proxy/${A}/8000/\r\n` +
        "Content-Security-Policy: sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads\r\n\r\n",
    );
    expect(splitHead(Buffer.from("HTTP/1.1 101 Switching"))).toBeUndefined();
    expect(() => splitHead(Buffer.alloc(17 * 1024, "a"))).toThrow(/too large/);
  });
});
