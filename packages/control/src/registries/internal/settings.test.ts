import { describe, expect, it } from "vitest";
import { DEFAULT_INTERNAL_REGISTRY, loadInternalRegistrySettings } from "./settings.ts";

describe("SANDBAR_INTERNAL_REGISTRY", () => {
  it("defaults to a loopback port, turns off, and refuses non-loopback or malformed addresses", () => {
    expect(DEFAULT_INTERNAL_REGISTRY).toBe("127.0.0.1:5050");
    expect(loadInternalRegistrySettings({})).toEqual({ enabled: true, host: "127.0.0.1", port: 5050 });
    expect(loadInternalRegistrySettings({ SANDBAR_INTERNAL_REGISTRY: "off" })).toEqual({ enabled: false });
    expect(loadInternalRegistrySettings({ SANDBAR_INTERNAL_REGISTRY: "localhost:0" })).toEqual({ enabled: true, host: "127.0.0.1", port: 0 });
    for (const bad of ["0.0.0.0:5050", "registry.example.com:5000", "127.0.0.1", "127.0.0.1:99999", "http://127.0.0.1:5050"]) {
      expect(() => loadInternalRegistrySettings({ SANDBAR_INTERNAL_REGISTRY: bad }), bad).toThrow(/SANDBAR_INTERNAL_REGISTRY must be off or a loopback host:port/);
    }
  });
});
