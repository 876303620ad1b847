import { readFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@sandbar/protocol";
import { sleep } from "./cgroups/types.ts";
import { USER_LEAF } from "./cgroups/types.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// Resize on real sandboxes: cpu and memory through the running sandbox's cgroup (read back from
// the kernel's files and felt by a process that was already running), the disk image grown while
// stopped, and the new resources kept for later starts.

let f: Fixture;
const created: string[] = [];
const MiB = 2 ** 20;

beforeAll(async () => {
  f = await fixture();
});

afterAll(() => disposeFixture(f, created));

async function started(prefix: string, over: Parameters<Fixture["spec"]>[1]): Promise<string> {
  const id = uniqueId(prefix);
  created.push(id);
  await f.provider.create(f.spec(id, over));
  await f.provider.start(id);
  return id;
}

/** A limit file of the sandbox's group (or its user leaf), from whichever hierarchy has it. */
async function limitFile(id: string, file: string, leaf = ""): Promise<number> {
  for (const dir of f.provider.cgroups.paths(id)) {
    const text = await readFile(path.join(dir, leaf, file), "utf8").catch(() => undefined);
    if (text !== undefined) return text.trim() === "max" ? Infinity : Number(text.trim().split(/\s+/)[0]);
  }
  throw new Error(`no ${file} for ${id}`);
}

const v2 = () => f.provider.cgroups.version === "v2";
const memoryLimit = (id: string, leaf = "") => limitFile(id, v2() ? "memory.max" : "memory.limit_in_bytes", leaf);
const cpuQuota = (id: string) => limitFile(id, v2() ? "cpu.max" : "cpu.cfs_quota_us");

async function refused(p: Promise<unknown>, code: Code, pattern: RegExp): Promise<void> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(ConnectError);
  expect((err as ConnectError).code).toBe(code);
  expect((err as ConnectError).rawMessage).toMatch(pattern);
}

describe("linux sandbox resize", () => {
  it("raises cpu and memory of a running sandbox at once: a process already running gets the new room", async () => {
    const id = await started("grow", { memoryGiB: 0.125, cpu: 0.5 });
    expect(await memoryLimit(id)).toBe(128 * MiB);
    expect(await cpuQuota(id)).toBe(50_000);
    // Started before the resize, it waits for a go, then holds 192 MiB: more than the whole old limit.
    const script = `const fs = require("fs"); const a = [];
      const wait = () => { if (!fs.existsSync("/tmp/go")) return setTimeout(wait, 20);
        for (let i = 0; i < 12; i++) a.push(Buffer.alloc(16 << 20, 1));
        fs.writeFileSync("/tmp/held", String(a.length)); setInterval(() => a.length, 1000); };
      wait();`;
    const bg = await sh(f.provider, id, `echo '${script}' > /tmp/hold.js; /opt/sandbar/bin/node /tmp/hold.js >/dev/null 2>&1 </dev/null & echo $!`);
    const pid = bg.stdout.trim();
    expect(pid).toMatch(/^\d+$/);

    const info = await f.provider.resize(id, { cpu: 1.5, memoryGiB: 0.5 });
    expect(info.state).toBe("started");
    expect(info.spec).toMatchObject({ cpu: 1.5, memoryGiB: 0.5 });
    expect(await memoryLimit(id)).toBe(512 * MiB);
    expect(await memoryLimit(id, USER_LEAF)).toBe(448 * MiB); // less the agent's 64 MiB reserve
    expect(await cpuQuota(id)).toBe(150_000);
    expect(info.usage?.memoryLimitBytes).toBe(512 * MiB);

    await sh(f.provider, id, "touch /tmp/go");
    let held = "";
    for (let i = 0; i < 250 && held === ""; i++) {
      held = (await sh(f.provider, id, "cat /tmp/held 2>/dev/null")).stdout;
      if (held === "") await sleep(20);
    }
    expect(held).toBe("12");
    expect((await sh(f.provider, id, `kill -0 ${pid} && echo alive`)).stdout).toBe("alive\n");
    expect((await f.provider.inspect(id)).usage?.oomKills).toBe(0);

    // Kept for the next start.
    await f.provider.stop(id, { force: true });
    await f.provider.start(id);
    expect(await memoryLimit(id)).toBe(512 * MiB);
    expect(await cpuQuota(id)).toBe(150_000);
  });

  it("grows the disk of a stopped sandbox: its files stay and a file larger than the old cap fits", async () => {
    const id = await started("disk", { diskGiB: 64 / 1024 });
    expect((await sh(f.provider, id, "head -c 20M /dev/urandom > ~/keep && sha256sum ~/keep")).stdout).toMatch(/^[0-9a-f]{64} /);
    const sum = (await sh(f.provider, id, "sha256sum ~/keep")).stdout;
    const full = await sh(f.provider, id, "head -c 80M /dev/zero > ~/big; echo rc=$?; rm -f ~/big");
    expect(full.stdout).toContain("rc=1"); // the old cap: 64 MiB
    await refused(f.provider.resize(id, { diskGiB: 0.25 }), Code.FailedPrecondition, /only grow while it is stopped/);

    await f.provider.stop(id);
    await refused(f.provider.resize(id, { diskGiB: 32 / 1024 }), Code.InvalidArgument, /cannot shrink/);
    const info = await f.provider.resize(id, { diskGiB: 0.25 });
    expect(info.spec.diskGiB).toBe(0.25);

    await f.provider.start(id);
    const after = await sh(f.provider, id, "head -c 150M /dev/zero > ~/big; echo rc=$?; df -m / | tail -1; sha256sum ~/keep");
    expect(after.stderr).toBe("");
    expect(after.stdout).toContain("rc=0");
    const lines = after.stdout.trim().split("\n");
    const sizeMb = Number(lines[1]!.split(/\s+/)[1]);
    expect(sizeMb).toBeGreaterThan(200);
    expect(sizeMb).toBeLessThanOrEqual(256);
    expect(`${lines[2]}\n`).toBe(sum);
  });

  it("a stopped sandbox takes new cpu and memory at its next start; bad values are refused", async () => {
    const id = await started("stopped", { memoryGiB: 0.25, cpu: 1 });
    await f.provider.stop(id);
    const info = await f.provider.resize(id, { cpu: 0.5, memoryGiB: 0.125 });
    expect(info.state).toBe("stopped");
    expect(info.spec).toMatchObject({ cpu: 0.5, memoryGiB: 0.125 });
    await f.provider.start(id);
    expect(await memoryLimit(id)).toBe(128 * MiB);
    expect(await cpuQuota(id)).toBe(50_000);
    await refused(f.provider.resize(id, { memoryGiB: 0.001 }), Code.InvalidArgument, /memoryGiB must be at least/);
    await refused(f.provider.resize(id, { cpu: Number.NaN }), Code.InvalidArgument, /cpu/);
    await refused(f.provider.resize(id, { diskGiB: 1 }), Code.FailedPrecondition, /running/);
    await refused(f.provider.resize("no-such-sandbox", { cpu: 1 }), Code.NotFound, /not found/);
    // A sandbox without a disk cap has no image to grow.
    await f.provider.stop(id);
    await refused(f.provider.resize(id, { diskGiB: 1 }), Code.FailedPrecondition, /no disk cap/);
  });
});
