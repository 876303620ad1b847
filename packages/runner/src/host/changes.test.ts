import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { copyLayer, squashInto } from "../linux/layers.ts";
import { type ChangeLayers, walkChanges } from "./changes.ts";

// The reader against a checkpoint, on real layer directories as overlayfs and the layer store
// leave them (whiteouts as 0/0 character devices, opaque directories as trusted xattrs, captured
// layers as cp -a copies): a sandbox's upper after a checkpoint, a fork's upper over the capture,
// and a checkpoint squashed into one layer all compare with the checkpoint's tree.

let dir: string;
const at = (...p: string[]) => path.join(dir, ...p);
const whiteout = (p: string) => execFileSync("mknod", [p, "c", "0", "0"]);
const opaque = (p: string) => execFileSync("setfattr", ["-n", "trusted.overlay.opaque", "-v", "y", p]);

async function files(root: string, entries: Record<string, string>): Promise<void> {
  for (const [p, content] of Object.entries(entries)) {
    await mkdir(path.dirname(path.join(root, p)), { recursive: true });
    await writeFile(path.join(root, p), content);
  }
}

async function walk(layers: ChangeLayers, prefix?: string): Promise<string[]> {
  const out: string[] = [];
  for await (const c of walkChanges(layers, { prefix })) out.push(`${c.kind} ${c.type} ${c.path}`);
  return out;
}

// What changed after the checkpoint, as the list reports it.
const SINCE_CP1 = ["deleted file /d/new1", "added file /d/new2", "modified file /d/x", "deleted file /d/y", "modified directory /e", "added file /e/w"];

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "changes-since-"));
  // The image, then the sandbox's upper up to the checkpoint: x rewritten, new1 added, z deleted, g replaced.
  await files(at("img"), { "d/x": "x0\n", "d/y": "y0\n", "e/z": "z0\n", "g/old": "old\n", "f": "f0\n" });
  await files(at("up"), { "d/x": "x1\n", "d/new1": "n1\n", "g/fresh": "fresh\n" });
  await mkdir(at("up/e"));
  whiteout(at("up/e/z"));
  opaque(at("up/g"));
  // The checkpoint: the upper captured as the layer store does (cp -a).
  await mkdir(at("top1"));
  await copyLayer(at("up"), at("top1"));
  // After it: x again, new1 gone, new2 added, y deleted, e replaced (rm -rf e; mkdir e; e/w).
  await files(at("up"), { "d/x": "x2, longer\n", "d/new2": "n2\n" });
  await rm(at("up/d/new1"));
  whiteout(at("up/d/y"));
  await rm(at("up/e"), { recursive: true });
  await files(at("up"), { "e/w": "w\n" });
  opaque(at("up/e"));
});

afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("changes since a checkpoint", () => {
  it("the sandbox the checkpoint was taken of: only what changed after it", async () => {
    expect(await walk({ upper: at("up"), lowers: [at("img")], since: [at("top1"), at("img")] })).toEqual(SINCE_CP1);
    // Since creation it is everything, as before.
    expect(await walk({ upper: at("up"), lowers: [at("img")] })).toEqual([
      "added file /d/new2", "modified file /d/x", "deleted file /d/y",
      "modified directory /e", "added file /e/w", "deleted file /e/z",
      "modified directory /g", "added file /g/fresh", "deleted file /g/old",
    ]);
  });

  it("a fork (its upper over the capture of the parent's): since the checkpoint and since its own creation", async () => {
    await mkdir(at("topF"));
    await copyLayer(at("up"), at("topF"));
    await files(at("upF"), { "d/forked": "f\n" });
    expect(await walk({ upper: at("upF"), lowers: [at("topF"), at("img")], since: [at("top1"), at("img")] })).toEqual(
      ["added file /d/forked", ...SINCE_CP1],
    );
    expect(await walk({ upper: at("upF"), lowers: [at("topF"), at("img")] })).toEqual(["added file /d/forked"]);
    // A sandbox made from the checkpoint itself stands on it: nothing changed until it writes.
    await mkdir(at("upC"));
    expect(await walk({ upper: at("upC"), lowers: [at("top1"), at("img")], since: [at("top1"), at("img")] })).toEqual([]);
  });

  it("a checkpoint squashed into one layer compares the same, and a prefix narrows it", async () => {
    await mkdir(at("sq"));
    await squashInto([at("top1")], at("sq"));
    expect(await walk({ upper: at("up"), lowers: [at("img")], since: [at("sq"), at("img")] })).toEqual(SINCE_CP1);
    expect(await walk({ upper: at("up"), lowers: [at("img")], since: [at("top1"), at("img")] }, "/e")).toEqual(["modified directory /e", "added file /e/w"]);
  });
});
