import { Code, ConnectError } from "@sandbar/protocol";
import { describe, expect, it } from "vitest";
import { parseImageRef } from "./ref.ts";

function refused(ref: unknown): string {
  try {
    parseImageRef(ref);
  } catch (err) {
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    return (err as ConnectError).rawMessage;
  }
  throw new Error(`${String(ref)} was accepted`);
}

describe("parseImageRef", () => {
  it("normalises Docker Hub names and keeps registries, ports, tags and digests", () => {
    expect(parseImageRef("python:3.12-slim")).toMatchObject({ registry: "docker.io", repository: "library/python", tag: "3.12-slim", canonical: "docker.io/library/python:3.12-slim" });
    expect(parseImageRef("org/tool:1")).toMatchObject({ registry: "docker.io", repository: "org/tool" });
    expect(parseImageRef("127.0.0.1:5000/a/b:v1")).toMatchObject({ registry: "127.0.0.1:5000", repository: "a/b", tag: "v1" });
    expect(parseImageRef("localhost/x:1")).toMatchObject({ registry: "localhost", repository: "x" });
    const d = "sha256:" + "a".repeat(64);
    expect(parseImageRef(`ghcr.io/o/r@${d}`)).toMatchObject({ registry: "ghcr.io", repository: "o/r", digest: d, canonical: `ghcr.io/o/r@${d}` });
    expect(parseImageRef(`ghcr.io/o/r:1.0@${d}`)).toMatchObject({ tag: "1.0", digest: d });
  });

  it("refuses what the reference refuses, with its messages", () => {
    expect(refused("ubuntu:latest")).toBe('Images with tag ":latest" are not allowed');
    expect(refused("ubuntu")).toBe("Image name must include a tag (e.g., ubuntu:22.04) or digest (@sha256:...)");
    expect(refused("127.0.0.1:5000/ubuntu")).toMatch(/must include a tag/);
    expect(refused("ubuntu@sha256:abc")).toBe("Invalid digest format. Must be image@sha256:64_hex_characters");
    expect(refused("Ubuntu:22.04")).toMatch(/^Invalid image name format/);
    expect(refused("a//b:1")).toMatch(/^Invalid image name format/);
    expect(refused("a b:1")).toMatch(/^Invalid image name format/);
    expect(refused("ubuntu:bad tag!")).toMatch(/^Invalid image name format/);
    expect(refused("")).toBe("Image name is required");
    expect(refused(42)).toBe("Image name is required");
  });
});
