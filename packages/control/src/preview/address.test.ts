import { describe, expect, it } from "vitest";
import { hostAddress, hostLabel, pathAddress } from "./address.ts";
import { withoutPreviewCookies } from "./cookie.ts";
import { withoutTokenParameter } from "./proxy.ts";

// How requests name their sandbox and port: only the address chooses them, never the rest.

const ID = "0f8fad5b-d9cb-469f-a165-70867728950e";

describe("preview addresses", () => {
  it("takes the first label under the preview domain only", () => {
    expect(hostLabel(`3000-${ID}.preview.example.com`, "preview.example.com")).toBe(`3000-${ID}`);
    expect(hostLabel(`3000-${ID}.PREVIEW.example.com:8443`, "preview.example.com")).toBe(`3000-${ID}`);
    expect(hostLabel(`3000-${ID}.preview.example.com.`, "preview.example.com")).toBe(`3000-${ID}`);
    expect(hostLabel(`a.3000-${ID}.preview.example.com`, "preview.example.com")).toBeUndefined();
    expect(hostLabel("preview.example.com", "preview.example.com")).toBeUndefined();
    expect(hostLabel(`3000-${ID}.preview.example.com.evil.net`, "preview.example.com")).toBeUndefined();
    expect(hostLabel(`3000-${ID}.xpreview.example.com`, "preview.example.com")).toBeUndefined();
    expect(hostLabel(undefined, "preview.example.com")).toBeUndefined();
  });

  it("reads port and id from a host label; bad ports are 400 Invalid port, other ids 404", () => {
    expect(hostAddress(`3000-${ID}`, "/a?b=1")).toEqual({ id: ID, signed: false, port: 3000, path: "/a?b=1", prefix: "" });
    expect(hostAddress(`443-${ID.toUpperCase()}`, "/")).toMatchObject({ id: ID, port: 443 });
    expect(hostAddress("8080-abcdefghij012345", "/")).toMatchObject({ id: "abcdefghij012345", signed: true, port: 8080 });
    for (const port of ["0", "65536", "99999", "", "3e3", "0x10"]) expect(() => hostAddress(`${port}-${ID}`, "/")).toThrow("Invalid port");
    expect(() => hostAddress(`3000-not-a-sandbox`, "/")).toThrow(/not found/);
    expect(() => hostAddress("justalabel", "/")).toThrow(/Not a preview host/);
    // An absolute-form or authority-form target could name another server.
    expect(() => hostAddress(`3000-${ID}`, "http://127.0.0.1:22/")).toThrow(/origin form/);
    expect(() => hostAddress(`3000-${ID}`, "127.0.0.1:22")).toThrow(/origin form/);
  });

  it("reads the path form, keeping the rest raw and the query", () => {
    expect(pathAddress(`/api/preview-proxy/${ID}/3000/x/%2e%2e/y?q=%20`, "/api")).toEqual({ id: ID, signed: false, port: 3000, path: "/x/%2e%2e/y?q=%20", prefix: `/api/preview-proxy/${ID}/3000` });
    expect(pathAddress(`/api/preview-proxy/${ID}/3000`, "/api").path).toBe("/");
    expect(pathAddress(`/api/preview-proxy/${ID}/3000?a=1`, "/api").path).toBe("/?a=1");
    expect(() => pathAddress(`/api/preview-proxy/${ID}/70000/`, "/api")).toThrow("Invalid port");
    expect(() => pathAddress(`/api/preview-proxy/%E0%A4%A/3000/`, "/api")).toThrow(/Malformed URL encoding/);
  });

  it("strips the token link's parameter and the proxy's own cookies, nothing else", () => {
    expect(withoutTokenParameter("/a?x=1&DAYTONA_SANDBOX_AUTH_KEY=t&y=2")).toBe("/a?x=1&y=2");
    expect(withoutTokenParameter("/a?DAYTONA_SANDBOX_AUTH_KEY=t")).toBe("/a");
    expect(withoutTokenParameter("/a?XDAYTONA_SANDBOX_AUTH_KEY=t")).toBe("/a?XDAYTONA_SANDBOX_AUTH_KEY=t");
    expect(withoutPreviewCookies(`a=1; sandbar-preview-${ID}=v; b=2`)).toBe("a=1; b=2");
    expect(withoutPreviewCookies(`sandbar-preview-${ID}=v`)).toBeUndefined();
  });
});
