import { expect, it } from "vitest";
import { loadRegistrySettings } from "./settings.ts";

it("reads the mirror and the insecure registries, refusing what is not a host[:port]", () => {
  expect(loadRegistrySettings({})).toEqual({ mirror: undefined, insecureRegistries: [] });
  expect(loadRegistrySettings({ SANDBAR_REGISTRY_MIRROR: "127.0.0.1:5000", SANDBAR_INSECURE_REGISTRIES: "registry.lan:5000, Build.Example" })).toEqual({
    mirror: "127.0.0.1:5000",
    insecureRegistries: ["registry.lan:5000", "build.example"],
  });
  expect(() => loadRegistrySettings({ SANDBAR_REGISTRY_MIRROR: "http://mirror.example" })).toThrow(/SANDBAR_REGISTRY_MIRROR must be registry hosts/);
  expect(() => loadRegistrySettings({ SANDBAR_INSECURE_REGISTRIES: "ok.example,bad/path" })).toThrow(/SANDBAR_INSECURE_REGISTRIES/);
});
