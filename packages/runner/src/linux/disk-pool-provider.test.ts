import { mkdir, open, readdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LinuxProvider } from "./provider.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, retry, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// The disk pool behind a real provider: a create takes a ready image, the cap holds on it, two
// sandboxes never share one, and a provider opened after a crash removes half-made images.

const BYTES = 64 * 2 ** 20;
let f: Fixture;
const created = new Set<string>();
const poolDir = () => path.join(f.dataDir, "disk-pool", String(BYTES));
const ready = async () => (await readdir(poolDir()).catch(() => [] as string[])).filter((n) => !n.startsWith("."));

beforeAll(async () => {
  f = await fixture({ diskPool: { perSize: 2, refillDelayMs: 0 } });
});

afterAll(() => disposeFixture(f, created));

async function uuid(image: string): Promise<string> {
  const fh = await open(image, "r");
  try {
    const sb = Buffer.alloc(16);
    await fh.read(sb, 0, 16, 1024 + 0x68);
    return sb.toString("hex");
  } finally {
    await fh.close();
  }
}

describe("disk image pool in the linux provider", () => {
  it("a create takes a ready image; the cap holds on it; two sandboxes never share one", async () => {
    const first = uniqueId("pool");
    created.add(first);
    await f.provider.create(f.spec(first, { diskGiB: 64 / 1024 })); // formats its own, asks for a refill
    await retry(async () => expect(await ready()).toHaveLength(2), 15_000);
    const pooled = new Set(await Promise.all((await ready()).map((n) => uuid(path.join(poolDir(), n)))));

    const ids = [uniqueId("pool"), uniqueId("pool")];
    for (const id of ids) created.add(id);
    await Promise.all(ids.map((id) => f.provider.create(f.spec(id, { diskGiB: 64 / 1024 }))));
    const uuids = await Promise.all([first, ...ids].map((id) => uuid(f.provider.layout.diskImage(id))));
    expect(new Set(uuids).size).toBe(3);
    expect(pooled).toEqual(new Set(uuids.slice(1))); // both came from the pool

    await f.provider.start(ids[0]!);
    const res = await sh(f.provider, ids[0]!, "head -c 200M /dev/zero > ~/fill; echo rc=$?; df -m / | tail -1");
    expect(res.stderr).toContain("No space left on device");
    expect(Number(res.stdout.trim().split("\n")[1]!.split(/\s+/)[1])).toBeLessThanOrEqual(64);
    await f.provider.start(ids[1]!);
    expect((await sh(f.provider, ids[1]!, "ls ~/fill 2>&1; df -m / | tail -1 | awk '{print $3}'")).stdout).toMatch(/No such file[^\n]*\n[0-9]\n/);
  });

  it("a provider opened on the data dir after a crash removes half-made images and keeps whole ones", async () => {
    await retry(async () => expect(await ready()).toHaveLength(2), 15_000);
    const whole = (await ready()).sort();
    await writeFile(path.join(poolDir(), ".00112233aabbccdd.img"), "cut short");
    await mkdir(path.join(f.dataDir, "disk-pool", "not-a-size"));
    const again = await LinuxProvider.open({ dataDir: f.dataDir, uidBase: 1_700_000_000, uidCount: 1024, diskPool: { perSize: 2 } });
    try {
      expect((await readdir(poolDir())).sort()).toEqual(whole);
      expect(await readdir(path.join(f.dataDir, "disk-pool"))).toEqual([String(BYTES)]);
    } finally {
      await again.close();
    }
  });
});
