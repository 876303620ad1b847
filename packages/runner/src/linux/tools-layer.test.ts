import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { SANDBOX_PATHS } from "../provider.ts";
import { SharedToolsLayers } from "./tools-layer.ts";

// Real files on a scratch dir: the layer is built once per set of tools and shared.
let dir: string;
let input: { initSh: string; node: string; bundle: string; main: string };

async function makeBundle(name: string, content: string): Promise<string> {
  const b = path.join(dir, name);
  await mkdir(path.join(b, "chunks"), { recursive: true });
  await writeFile(path.join(b, "agent.mjs"), content);
  await writeFile(path.join(b, "chunks", "c.mjs"), "export {}");
  return b;
}

beforeEach(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "tools-layer-"));
  await writeFile(path.join(dir, "sh"), "#!/bin/sh");
  await writeFile(path.join(dir, "node"), "node");
  input = { initSh: path.join(dir, "sh"), node: path.join(dir, "node"), bundle: await makeBundle("dist", "v1"), main: "agent.mjs" };
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const inLayer = (layer: string, p: string) => path.join(layer, p.slice(1));

it("builds a layer once for the same tools, complete even when starts ask for it at once", async () => {
  const layers = new SharedToolsLayers(path.join(dir, "layers"), async () => new Set());
  const [a, b, c] = await Promise.all([layers.layer(input), layers.layer(input), layers.layer(input)]);
  expect(b).toEqual(a);
  expect(c).toEqual(a);
  expect(a.agentEntry).toBe(path.join(SANDBOX_PATHS.agent, "agent.mjs"));
  expect(await readFile(inLayer(a.dir, SANDBOX_PATHS.node), "utf8")).toBe("node");
  expect(await readFile(path.join(inLayer(a.dir, SANDBOX_PATHS.agent), "chunks", "c.mjs"), "utf8")).toBe("export {}");
  expect(await readdir(path.join(dir, "layers"))).toEqual([path.basename(a.dir)]);
  // Hard links of the sources, not copies.
  expect((await stat(inLayer(a.dir, SANDBOX_PATHS.node))).ino).toBe((await stat(input.node)).ino);
});

it("a rebuilt bundle or a replaced node names a new layer; older ones go once no sandbox links to them", async () => {
  let linked = new Set<string>();
  const layers = new SharedToolsLayers(path.join(dir, "layers"), async () => linked);
  const first = await layers.layer(input);

  // build.ts makes the bundle directory anew.
  await rm(input.bundle, { recursive: true });
  input.bundle = await makeBundle("dist", "v2, rebuilt");
  const second = await layers.layer(input);
  expect(second.dir).not.toBe(first.dir);
  expect(await readFile(path.join(inLayer(second.dir, SANDBOX_PATHS.agent), "agent.mjs"), "utf8")).toBe("v2, rebuilt");
  // This process handed the first one out (a start may still be mounting it): kept.
  expect((await readdir(path.join(dir, "layers"))).sort()).toEqual([path.basename(first.dir), path.basename(second.dir)].sort());

  // Another process (a restarted runner): a linked layer is kept, an unlinked one removed.
  linked = new Set([second.dir]);
  const other = new SharedToolsLayers(path.join(dir, "layers"), async () => linked);
  await rm(input.node);
  await writeFile(input.node, "node 2");
  const third = await other.layer(input);
  expect(await readFile(inLayer(third.dir, SANDBOX_PATHS.node), "utf8")).toBe("node 2");
  expect((await readdir(path.join(dir, "layers"))).sort()).toEqual([path.basename(second.dir), path.basename(third.dir)].sort());
});

it("a single-script agent is placed under its own name", async () => {
  await writeFile(path.join(dir, "exec-agent.mjs"), "x");
  const layers = new SharedToolsLayers(path.join(dir, "layers"), async () => new Set());
  const l = await layers.layer({ initSh: input.initSh, node: input.node, bundle: path.join(dir, "exec-agent.mjs") });
  expect(l.agentEntry).toBe(path.join(SANDBOX_PATHS.agent, "exec-agent.mjs"));
  expect(await readFile(inLayer(l.dir, l.agentEntry), "utf8")).toBe("x");
});
