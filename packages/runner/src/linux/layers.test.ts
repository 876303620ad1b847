import { chmod, lstat, mkdir, readdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_LAYERS } from "../spec.ts";
import { disposeFixture } from "../testing/dispose.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sh, uniqueId } from "./testing/harness.ts";

// Captured layers: a running sandbox's writable layer copied while frozen, stacked read-only under
// new sandboxes (forks); whiteouts stay deletions; stacks squash; the parent keeps running.

let f: Fixture;
const created = new Set<string>();

beforeAll(async () => {
  f = await fixture();
  await mkdir(path.join(f.rootfs, "srv/base"), { recursive: true });
  await chmod(path.join(f.rootfs, "srv/base"), 0o777);
  await writeFile(path.join(f.rootfs, "srv/base/gone.txt"), "base\n", { mode: 0o666 });
  await writeFile(path.join(f.rootfs, "srv/base/kept.txt"), "base\n", { mode: 0o666 });
});

afterAll(async () => {
  await f.provider.removeLayers((await f.provider.listLayers()).map((l) => l.id));
  await disposeFixture(f, created);
});

async function make(prefix: string, layers: string[] = [], diskGiB = 0.25): Promise<string> {
  const id = uniqueId(prefix);
  created.add(id);
  await f.provider.create(f.spec(id, { layers, diskGiB }));
  await f.provider.start(id);
  return id;
}

const out = async (id: string, script: string) => {
  const r = await sh(f.provider, id, script);
  expect(r.stderr).toBe("");
  return r.stdout;
};

describe("captured layers", () => {
  it("a fork sees the parent's files and deletions at the capture; later writes stay apart", async () => {
    const parent = await make("lp");
    await out(parent, "mkdir -p ~/pkg/mod && echo v1 > ~/pkg/mod/__init__.py && rm /srv/base/gone.txt && (sleep 600 >/dev/null 2>&1 &) && echo ok");
    const layer = uniqueId("layer");
    await f.provider.captureLayer(parent, layer);
    expect(await f.provider.cgroups.frozen(parent)).toBe(false);
    // The whiteout came along as a 0/0 character device.
    const wh = await lstat(path.join(f.provider.layers.root(layer), "srv/base/gone.txt"));
    expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    // The agent's own state is not part of the layer.
    expect(await readdir(path.join(f.provider.layers.root(layer), "tmp")).catch(() => [])).not.toContain(".sandbar-agent");

    const fork = await make("lf", [layer]);
    expect(await out(fork, "cat ~/pkg/mod/__init__.py; ls /srv/base; pgrep -c sleep || true")).toBe("v1\nkept.txt\n0\n");
    // Writes and deletions in either are invisible to the other; the fork owns its files.
    await out(parent, "echo parent > ~/p.txt && rm ~/pkg/mod/__init__.py");
    await out(fork, "echo fork > ~/f.txt && echo v2 > ~/pkg/mod/__init__.py && rm /srv/base/kept.txt");
    expect(await out(parent, "ls ~; ls ~/pkg/mod; ls /srv/base")).toBe("p.txt\npkg\nkept.txt\n");
    expect(await out(fork, "ls ~; cat ~/pkg/mod/__init__.py; ls /srv/base")).toBe("f.txt\npkg\nv2\n");
    expect((await f.provider.inspect(parent)).state).toBe("started");
  });

  it("a stopped sandbox is captured without a freeze; stacks of forks squash to one layer, whiteouts kept", async () => {
    const parent = await make("sp");
    await out(parent, "echo 0 > ~/n && rm /srv/base/gone.txt; echo");
    await f.provider.stop(parent);
    let stack: string[] = [];
    let from = parent;
    for (let i = 1; i <= 3; i++) {
      const layer = uniqueId(`l${i}`);
      await f.provider.captureLayer(from, layer);
      stack = [layer, ...stack];
      from = await make(`s${i}`, stack);
      await out(from, `echo ${i} > ~/n && echo ${i} > ~/only-${i} && rm -f ~/only-${i - 1}; echo`);
    }
    const squashed = uniqueId("sq");
    await f.provider.squashLayers(stack, squashed);
    const top = uniqueId("top");
    await f.provider.captureLayer(from, top);
    const last = await make("sl", [top, squashed]);
    expect(await out(last, "cat ~/n; ls ~; ls /srv/base")).toBe("3\nn\nonly-3\nkept.txt\n");
    expect(MAX_LAYERS).toBe(8);
  });

  it("a layer that is not on the host fails the create clearly", async () => {
    const id = uniqueId("nol");
    await expect(f.provider.create(f.spec(id, { layers: ["missing-layer"] }))).rejects.toThrow(/layer missing-layer is not on this host/);
  });
});
