import { access, readFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sleep } from "./cgroups/types.ts";
import { LinuxProvider } from "./provider.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// /proc/meminfo in a sandbox shows its cgroup's memory (limit, usage of both leaves), kept current
// by the runner; procps `free` and node's os.totalmem() read it.

const GiB = 2 ** 30;
let f: Fixture;
const created: string[] = [];

beforeAll(async () => {
  f = await fixture({ meminfoRefreshMs: 200 });
});

afterAll(() => disposeFixture(f, created));

async function started(prefix: string, memoryGiB: number): Promise<string> {
  const id = uniqueId(prefix);
  created.push(id);
  await f.provider.create(f.spec(id, { memoryGiB }));
  await f.provider.start(id);
  return id;
}

/** `free -b`'s Mem: row as { total, used, free, available }. */
async function free(id: string): Promise<Record<string, number>> {
  const out = (await sh(f.provider, id, "free -b")).stdout.split("\n");
  const head = out[0].trim().split(/\s+/);
  const row = out.find((l) => l.startsWith("Mem:"))!.trim().split(/\s+/).slice(1).map(Number);
  return Object.fromEntries(head.map((h, i) => [h, row[i]]));
}

async function until<T>(what: string, probe: () => Promise<T>, ok: (v: T) => boolean, deadlineMs = 30_000): Promise<T> {
  const end = performance.now() + deadlineMs;
  for (;;) {
    const v = await probe();
    if (ok(v)) return v;
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(v)}`);
    await sleep(100);
  }
}

const hostTotalKb = async () => /^MemTotal:\s+(\d+) kB$/m.exec(await readFile("/proc/meminfo", "utf8"))![1];

describe("a sandbox's /proc/meminfo", () => {
  it("shows the memory limit as the total, no swap, and the host's total nowhere", async () => {
    const id = await started("meminfo", 1);
    const text = (await sh(f.provider, id, "cat /proc/meminfo")).stdout;
    expect(text).toMatch(/^MemTotal: +1048576 kB$/m);
    expect(text).toMatch(/^SwapTotal: +0 kB$/m);
    expect(text).not.toContain(` ${await hostTotalKb()} kB`);
    // The host's keys, in its order (parsers look some up by position).
    const keys = (s: string) => s.split("\n").filter(Boolean).map((l) => l.split(":")[0]);
    expect(keys(text)).toEqual(keys(await readFile("/proc/meminfo", "utf8")));
    expect((await free(id)).total).toBe(GiB);
    const node = await sh(f.provider, id, "/opt/sandbar/bin/node -p 'const os = require(\"os\"); os.totalmem() + \" \" + (os.freemem() <= os.totalmem())'");
    expect(node.stdout).toBe(`${GiB} true\n`);
  });

  it("counts a user process's memory in `used` (the user leaf too), and forgets a stopped sandbox", async () => {
    const id = await started("meminfo-use", 1);
    const before = await free(id);
    // Into the user leaf (its procs files, one per v1 hierarchy) as the agent's user processes are.
    await sh(f.provider, id, `sh -c 'for p in /opt/sandbar/cgroup/*; do echo $$ > $p; done; exec python3 -c "b = bytearray(200 << 20); import time; time.sleep(600)"' >/dev/null 2>&1 &`);
    const after = await until("used to rise by 200 MB", () => free(id), (v) => v.used - before.used > 190 * 2 ** 20);
    expect(after.total).toBe(GiB);
    expect(after.used - before.used).toBeLessThan(260 * 2 ** 20);
    expect(after.available).toBeLessThan(before.available - 190 * 2 ** 20);
    const leaf = (await sh(f.provider, id, `cat /proc/$(pgrep -f "bytearra[y]")/cgroup`)).stdout;
    expect(leaf).toMatch(/\/user$/m);

    expect(f.provider.meminfo.tracked()).toContain(id);
    await f.provider.stop(id, { force: true });
    expect(f.provider.meminfo.tracked()).not.toContain(id);
    await expect(access(path.join(f.provider.layout.runtime(id), "meminfo"))).rejects.toThrow();
  });

  it("a new runner on the data dir refreshes the views of the sandboxes it finds running", async () => {
    const id = await started("meminfo-adopt", 1);
    const again = await LinuxProvider.open({ dataDir: f.dataDir, uidBase: (await f.provider.inspect(id)).hostUid - 10, uidCount: 1024, meminfoRefreshMs: 200 });
    try {
      expect(again.meminfo.tracked()).toContain(id);
      f.provider.meminfo.untrack(id); // the old runner is gone: only the new one writes
      await again.resize(id, { memoryGiB: 0.75 });
      await until("the new limit", () => free(id), (v) => v.total === 0.75 * GiB);
    } finally {
      again.meminfo.close();
    }
  });
});
