import { Code, ConnectError } from "@sandbar/protocol";
import { describe, expect, it } from "vitest";
import type { SandboxSpec } from "./provider.ts";
import { validateSpec } from "./spec.ts";

const good: SandboxSpec = {
  id: "sbx-1",
  rootfs: "/srv/rootfs",
  cpu: 0.5,
  memoryGiB: 1,
  pidsLimit: 128,
  init: { node: "/usr/bin/node", bundle: "/opt/agent", main: "main.js", args: ["--root", "/home/sandbar"] },
};

function rejects(over: Partial<SandboxSpec> | Record<string, unknown>, text: string): void {
  let err: unknown;
  try {
    validateSpec({ ...good, ...over } as SandboxSpec);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(ConnectError);
  expect((err as ConnectError).code).toBe(Code.InvalidArgument);
  expect((err as ConnectError).message).toContain(text);
}

describe("sandbox spec validation", () => {
  it("normalises a good spec with defaults", () => {
    const spec = validateSpec(good);
    expect(spec).toEqual({ ...good, mounts: [], env: {}, network: "none", user: "sandbar", init: { ...good.init, nodeArgs: [] } });
  });

  it("rejects each bad field with a message naming it", () => {
    rejects({ id: "../etc" }, "sandbox id");
    rejects({ id: "x".repeat(64) }, "sandbox id");
    rejects({ rootfs: "relative/path" }, "rootfs must be an absolute path");
    rejects({ rootfs: "/a/../b" }, "must not contain '..'");
    rejects({ cpu: 0 }, "cpu must be at least 0.01");
    rejects({ cpu: Number.NaN }, "cpu must be a number");
    rejects({ memoryGiB: 0.001 }, "memoryGiB must be at least 16 MiB");
    rejects({ diskGiB: 0 }, "diskGiB must be at least 16 MiB");
    rejects({ pidsLimit: 1.5 }, "pidsLimit must be a positive integer");
    rejects({ env: { "BAD-NAME": "x" } }, "env name");
    rejects({ env: { OK: 1 } }, "env OK must be a string");
    rejects({ network: "bridge" as "none" }, 'network mode "bridge" is not supported');
    rejects({ user: "Root" }, "user");
    rejects({ mounts: [{ source: "/x", target: "/proc/x" }] }, "reserved");
    rejects({ mounts: [{ source: "/x", target: "/opt" }] }, "reserved");
    rejects({ mounts: [{ source: "/x", target: "/" }] }, "must not be '/'");
    rejects({ init: { node: "node", bundle: "/a" } }, "init.node must be an absolute path");
    rejects({ init: { node: "/n", bundle: "/a", main: "../x.js" } }, "init.main");
    rejects({ init: { node: "/n", bundle: "/a", args: [1] } }, "init.args");
    rejects({ init: undefined }, "init is required");
    rejects({ workdir: "app" }, "workdir must be an absolute path");
    rejects({ workdir: "/app/../etc" }, "workdir must be an absolute path without");
  });

  it("keeps a workdir (an image's WORKDIR)", () => {
    expect(validateSpec({ ...good, workdir: "/app" }).workdir).toBe("/app");
  });

  it("checks volumes: absolute root and target, no reserved target, a relative subpath without '..'", () => {
    expect(validateSpec({ ...good, volumes: [{ root: "/v/1", target: "/data/", subpath: "a/./b" }] }).volumes).toEqual([{ root: "/v/1", target: "/data/", subpath: "a/b" }]);
    expect(validateSpec({ ...good, volumes: [{ root: "/v/1", target: "/data", subpath: "" }] }).volumes).toEqual([{ root: "/v/1", target: "/data" }]);
    rejects({ volumes: [{ root: "v/1", target: "/data" }] }, "volumes[0].root must be an absolute path");
    rejects({ volumes: [{ root: "/v/1", target: "/proc/x" }] }, "reserved");
    rejects({ volumes: [{ root: "/v/1", target: "/" }] }, "must not be '/'");
    rejects({ volumes: [{ root: "/v/1", target: "/d", subpath: "../x" }] }, "volumes[0].subpath must be a relative path without '..'");
    rejects({ volumes: [{ root: "/v/1", target: "/d", subpath: "/abs" }] }, "volumes[0].subpath");
    rejects({ volumes: "x" }, "volumes must be an array");
  });
});
