import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { classify } from "./skopeo.ts";

const codeOf = (stderr: string) => ConnectError.from(classify("127.0.0.1:38401/test/nope:1.0", stderr, 1)).code;

describe("skopeo's errors", () => {
  it("read HTTP statuses, not the digits of a registry's port or address", () => {
    // Found by CI: a registry on port 38401 made every failure there look like a 401.
    expect(codeOf('reading manifest 1.0 in 127.0.0.1:38401/test/nope: manifest unknown')).toBe(Code.NotFound);
    expect(codeOf("Get \"http://127.0.0.1:40404/v2/\": connection refused")).toBe(Code.Unavailable);
    expect(codeOf("unexpected status code 401 when reading manifest")).toBe(Code.PermissionDenied);
    expect(codeOf("received unexpected HTTP status: 404 Not Found")).toBe(Code.NotFound);
    expect(codeOf("authentication required")).toBe(Code.PermissionDenied);
  });
});
