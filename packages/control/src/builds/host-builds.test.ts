import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { BuildSnapshotRequestSchema, type BuildSnapshotRequest } from "@sandbar/protocol/gen/sandbar/runner/v1/runner_pb.js";
import * as tar from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readContexts } from "./host-builds.ts";

// The runner's reading of a build's request stream: each context's bytes, in the spec's order,
// unpacked into the build dir. Real tar archives, an async generator standing in for the call.

let scratch: string;
const archive = async (files: Record<string, string>): Promise<Buffer> => {
  const dir = await mkdtemp(path.join(scratch, "src-"));
  for (const [name, content] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, name)), { recursive: true });
    await writeFile(path.join(dir, name), content);
  }
  const parts: Buffer[] = [];
  for await (const c of tar.c({ cwd: dir, portable: true }, Object.keys(files))) parts.push(c as Buffer);
  return Buffer.concat(parts);
};
const msg = (part: BuildSnapshotRequest["part"]) => create(BuildSnapshotRequestSchema, { part });

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), "sandbar-host-builds-"));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

describe("a build's contexts off its request stream", () => {
  it("unpacks two contexts whose archives arrive whole, the next one a while later (tar ends before its source)", async () => {
    const a = await archive({ "etc/app/config.ini": "[app]\n" });
    const b = await archive({ "bin/tool": "#!/bin/sh\n" });
    async function* requests() {
      yield msg({ case: "contextHash", value: "ha" });
      yield msg({ case: "data", value: a });
      await new Promise((r) => setTimeout(r, 100)); // control opening the next context
      yield msg({ case: "contextHash", value: "hb" });
      // In pieces, the last one after a pause.
      yield msg({ case: "data", value: b.subarray(0, 700) });
      await new Promise((r) => setTimeout(r, 50));
      yield msg({ case: "data", value: b.subarray(700) });
    }
    const dir = await mkdtemp(path.join(scratch, "ctx-"));
    const lines: string[] = [];
    await readContexts(requests(), ["ha", "hb"], dir, AbortSignal.timeout(10_000), (l) => lines.push(l));
    expect(await readFile(path.join(dir, "etc/app/config.ini"), "utf8")).toBe("[app]\n");
    expect(await readFile(path.join(dir, "bin/tool"), "utf8")).toBe("#!/bin/sh\n");
    expect(lines).toEqual(["unpacking context ha", "unpacking context hb"]);
  });

  it("refuses contexts out of the spec's order, a missing one, and bytes that are no tar archive", async () => {
    const a = await archive({ "a.txt": "a\n" });
    const dir = await mkdtemp(path.join(scratch, "ctx-"));
    const run = (hashes: string[], ...parts: BuildSnapshotRequest["part"][]) =>
      readContexts(
        (async function* () {
          for (const p of parts) yield msg(p);
        })(),
        hashes,
        dir,
        undefined,
        () => undefined,
      ).then(() => undefined, (e: Error) => e.message);
    expect(await run(["ha", "hb"], { case: "contextHash", value: "hb" }, { case: "data", value: a })).toMatch(/the bytes of context ha were expected next/);
    expect(await run(["ha", "hb"], { case: "contextHash", value: "ha" }, { case: "data", value: a })).toMatch(/the bytes of context hb were expected next/);
    expect(await run(["ha"], { case: "contextHash", value: "ha" }, { case: "data", value: Buffer.alloc(1024, 7) })).toMatch(/Build context ha is not a readable tar archive/);
    expect(await run([], { case: "contextHash", value: "hz" })).toMatch(/carries more than the spec's contexts/);
  });
});
