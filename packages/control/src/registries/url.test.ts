import { describe, expect, it } from "vitest";
import { canonicalRegistryHost, parseRegistryUrl } from "./url.ts";

describe("registry URLs", () => {
  it("normalises what users type and names the host as image references do", () => {
    const cases: Array<[string, string, string]> = [
      ["registry.example.com", "registry.example.com", "registry.example.com"],
      ["  HTTPS://Registry.Example.com/  ", "https://registry.example.com", "registry.example.com"],
      ["https://registry.example.com:443/v2/", "https://registry.example.com/v2", "registry.example.com"],
      ["registry.example.com:443", "registry.example.com", "registry.example.com"],
      ["http://127.0.0.1:5000", "http://127.0.0.1:5000", "127.0.0.1:5000"],
      ["localhost:5000", "localhost:5000", "localhost:5000"],
      ["[::1]:5000", "[::1]:5000", "[::1]:5000"],
      ["https://index.docker.io/v1/", "https://index.docker.io/v1", "docker.io"],
      ["registry-1.docker.io", "registry-1.docker.io", "docker.io"],
      ["docker.io", "docker.io", "docker.io"],
      ["ghcr.io/my-org", "ghcr.io/my-org", "ghcr.io"],
      ["https://Bücher.example/x", "https://xn--bcher-kva.example/x", "xn--bcher-kva.example"],
    ];
    for (const [input, url, host] of cases) expect(parseRegistryUrl(input), input).toEqual({ url, host });
  });

  it("refuses what is not a registry address", () => {
    for (const input of ["", "   ", "nohost", "ftp://r.example.com", "file:///etc/passwd", "https://u:p@r.example.com", "r.example.com?x", "r.example.com#f", "http://", "r.example.com/a b", "https://r.example.123", "-a.example.com", "a..example.com", "x".repeat(2049), `r.example.com/${"ä".repeat(1000)}`]) {
      expect(parseRegistryUrl(input), input).toBeUndefined();
    }
  });

  it("folds Docker Hub's names and case", () => {
    expect(["docker.io", "index.docker.io", "registry-1.docker.io", "Registry-1.Docker.IO"].map(canonicalRegistryHost)).toEqual(Array(4).fill("docker.io"));
    expect(canonicalRegistryHost("Quay.io")).toBe("quay.io");
    expect(canonicalRegistryHost("127.0.0.1:5000")).toBe("127.0.0.1:5000");
  });
});
