import { mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { snapshotBlobName } from "@sandbar/agent/snapshot-blob";
import { agentInit } from "./local-runtime.ts";

// Which command a sandbox's agent gets for a bundle directory: from the startup snapshot only when the
// bundle holds a blob built by this node (the node sandboxes run); agent.mjs otherwise. Building and
// running the blob is packages/agent/src/bundle.test.ts; a sandbox running it is real-agent.test.ts.

let bundle: string;
beforeAll(async () => {
  bundle = await mkdtemp(path.join(tmpdir(), "agent-init-"));
  await writeFile(path.join(bundle, "agent.mjs"), "");
});
afterAll(async () => {
  await rm(bundle, { recursive: true, force: true });
});

it("starts from the bundle's snapshot when it was built by this node's version and architecture", async () => {
  await writeFile(path.join(bundle, snapshotBlobName()), "");
  expect(await agentInit(bundle)).toEqual({
    node: process.execPath,
    bundle,
    main: "agent.mjs",
    args: ["--preload"],
    nodeArgs: ["--use-openssl-ca", "--snapshot-blob", `/opt/sandbar/agent/${snapshotBlobName()}`],
  });
});

it("runs agent.mjs when the bundle's snapshot is another node's, or there is none", async () => {
  await rename(path.join(bundle, snapshotBlobName()), path.join(bundle, snapshotBlobName("v22.0.0")));
  const other = await agentInit(bundle);
  expect(other.nodeArgs).toEqual(["--use-openssl-ca"]);
  expect(other.main).toBe("agent.mjs");
  await rm(path.join(bundle, snapshotBlobName("v22.0.0")));
  expect((await agentInit(bundle)).nodeArgs).toEqual(["--use-openssl-ca"]);
});

it("runs a single-script agent as given", async () => {
  const script = path.join(bundle, "agent.mjs");
  expect(await agentInit(script)).toEqual({ node: process.execPath, bundle: script });
});
