import { describe, expect, it } from "vitest";
import { DEFAULT_INTERNAL_REGISTRY, loadInternalRegistrySettings } from "./settings.ts";

describe("SANDBAR_INTERNAL_REGISTRY, SANDBAR_PUSH_REGISTRY", () => {
  it("defaults to an embedded registry on a loopback port, turns off, and refuses non-loopback or malformed addresses", () => {
    expect(DEFAULT_INTERNAL_REGISTRY).toBe("127.0.0.1:5050");
    expect(loadInternalRegistrySettings({})).toEqual({ enabled: true, host: "127.0.0.1", port: 5050 });
    expect(loadInternalRegistrySettings({ SANDBAR_INTERNAL_REGISTRY: "off" })).toEqual({ enabled: false });
    expect(loadInternalRegistrySettings({ SANDBAR_INTERNAL_REGISTRY: "localhost:0" })).toEqual({ enabled: true, host: "127.0.0.1", port: 0 });
    for (const bad of ["0.0.0.0:5050", "registry.example.com:5000", "127.0.0.1", "127.0.0.1:99999", "http://127.0.0.1:5050"]) {
      expect(() => loadInternalRegistrySettings({ SANDBAR_INTERNAL_REGISTRY: bad }), bad).toThrow(/^SANDBAR_INTERNAL_REGISTRY must be off or a loopback host:port/);
    }
  });

  it("points at an external registry with the token service on its own address", () => {
    expect(loadInternalRegistrySettings({ SANDBAR_PUSH_REGISTRY: "Registry.Example.com:5000" })).toEqual({ enabled: true, external: "registry.example.com:5000", tokenService: { host: "0.0.0.0", port: 5051 } });
    expect(loadInternalRegistrySettings({ SANDBAR_PUSH_REGISTRY: "10.0.0.5:443", SANDBAR_REGISTRY_TOKEN_ADDR: "10.0.0.1:8443", SANDBAR_INTERNAL_REGISTRY: "off" })).toEqual({
      enabled: true,
      external: "10.0.0.5:443",
      tokenService: { host: "10.0.0.1", port: 8443 },
    });
    expect(() => loadInternalRegistrySettings({ SANDBAR_PUSH_REGISTRY: "https://registry.example.com" })).toThrow(/^SANDBAR_PUSH_REGISTRY must be a host:port/);
    expect(() => loadInternalRegistrySettings({ SANDBAR_PUSH_REGISTRY: "registry.example.com:0" })).toThrow(/must name the registry's port/);
    expect(() => loadInternalRegistrySettings({ SANDBAR_PUSH_REGISTRY: "r.example.com:5000", SANDBAR_REGISTRY_TOKEN_ADDR: "nope" })).toThrow(/^SANDBAR_REGISTRY_TOKEN_ADDR must be a host:port/);
  });
});
