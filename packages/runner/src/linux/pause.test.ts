import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { Code, ConnectError } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LinuxProvider } from "./provider.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, processesOfUid, retry, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// Pause and resume on the linux provider (DESIGN.md decision 20): the whole sandbox group frozen,
// its memory reclaimed as far as the host allows, thawed with every process as it was; a paused
// sandbox survives a new provider on the same data dir, and stop and destroy work on it.

let f: Fixture;
const created = new Set<string>();

beforeAll(async () => {
  f = await fixture();
});

afterAll(() => disposeFixture(f, created));

async function make(prefix: string, memoryGiB = 0.5): Promise<string> {
  const id = uniqueId(prefix);
  created.add(id);
  await f.provider.create(f.spec(id, { memoryGiB }));
  await f.provider.start(id);
  return id;
}

/** Polls `read` until `ok` holds (10 s deadline). */
async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`condition not met within ${ms} ms; last value ${JSON.stringify(v)}`);
    await delay(20);
  }
}

const MiB = 1 << 20;
/** A loop holding 500 MB (every page touched) that writes its counter to /tmp/counter every 10 ms. */
const LOOP = [
  "import time",
  "b = bytearray(500 << 20)",
  "for i in range(0, len(b), 4096): b[i] = 1",
  "n = 0",
  "while True:",
  "    n += 1",
  "    open('/tmp/counter.new', 'w').write(str(n))",
  "    __import__('os').rename('/tmp/counter.new', '/tmp/counter')",
  "    time.sleep(0.01)",
].join("\n");

/** The loop's counting, without the memory, on the host: writes its counter to the file it is given. */
const WITNESS = [
  "import os, sys, time",
  "n = 0",
  "while True:",
  "    n += 1",
  "    open(sys.argv[1] + '.new', 'w').write(str(n))",
  "    os.rename(sys.argv[1] + '.new', sys.argv[1])",
  "    time.sleep(0.01)",
].join("\n");

/** The loop's counter, read from the host (the sandbox's /tmp is in its writable layer). */
async function counter(id: string): Promise<number> {
  const file = path.join(f.provider.layout.upper(id, false), "tmp/counter");
  return Number((await readFile(file, "utf8").catch(() => "0")) || 0);
}

async function pythonPid(id: string): Promise<number | undefined> {
  for (const pid of await f.provider.cgroups.pids(id)) {
    const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmd.startsWith("python3\0-c")) return pid;
  }
  return undefined;
}

async function expectCode(p: Promise<unknown>, code: Code): Promise<void> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(ConnectError);
  expect((err as ConnectError).code).toBe(code);
}

describe("linux pause and resume", () => {
  it("a loop holding 500 MB: frozen (no CPU) while paused, memory reported, and on after resume with its state", async () => {
    const id = await make("pause", 1.5);
    // Page cache the reclaim can give back (written through: clean pages), then the loop.
    await sh(f.provider, id, "dd if=/dev/zero of=/tmp/cache bs=1M count=64 conv=fsync status=none && cat /tmp/cache > /dev/null");
    await sh(f.provider, id, `python3 -c "${LOOP}" >/dev/null 2>&1 &`);
    await until(() => counter(id), (n) => n > 20);
    const pid = await pythonPid(id);
    expect(pid).toBeDefined();
    await until(async () => (await f.provider.inspect(id)).usage?.memoryBytes ?? 0, (b) => b > 500 * MiB);

    const paused = await f.provider.pause(id);
    expect(paused.state).toBe("paused");
    expect(await f.provider.cgroups.frozen(id)).toBe(true);
    const mem = paused.paused!;
    console.log(`pause memory (cgroup ${f.provider.cgroups.version}): ${(mem.residentBytes / MiB).toFixed(0)} MiB stay resident, ${((mem.reclaimedBytes ?? 0) / MiB).toFixed(0)} MiB reclaimed (${mem.method})`);
    // Without swap the loop's 500 MB of anonymous memory stays (on v1 and v2 alike); page cache goes.
    expect(mem.residentBytes).toBeGreaterThan(500 * MiB);
    expect(mem.reclaimedBytes).toBeGreaterThan(32 * MiB);
    expect(mem.method).toBe(f.provider.cgroups.version === "v1" ? "limit" : "memory.reclaim");
    // The limit the reclaim lowered is back.
    expect((await f.provider.inspect(id)).usage?.memoryLimitBytes).toBe(paused.usage?.memoryLimitBytes);

    // Frozen: while the same loop running on the host (a witness, not frozen) writes its counter 50
    // times, the sandbox's writes none and uses no CPU.
    const cpu0 = (await f.provider.cgroups.stats(id))!.cpuUsageUsec;
    const n0 = await counter(id);
    const witnessFile = path.join(f.dataDir, `witness-${id}`);
    const witness = spawn("python3", ["-c", WITNESS, witnessFile], { stdio: "ignore" });
    try {
      const witnessed = async () => Number((await readFile(witnessFile, "utf8").catch(() => "0")) || 0);
      await until(witnessed, (n) => n >= 50);
    } finally {
      witness.kill("SIGKILL");
    }
    expect((await f.provider.cgroups.stats(id))!.cpuUsageUsec).toBe(cpu0);
    expect(await counter(id)).toBe(n0);

    const resumed = await f.provider.resume(id);
    expect(resumed.state).toBe("started");
    expect(resumed.paused).toBeUndefined();
    // The same process goes on from where it was (not restarted: the counter continues).
    const after = await until(() => counter(id), (n) => n > n0 + 10);
    expect(after).toBeGreaterThan(n0);
    expect(await pythonPid(id)).toBe(pid);
    expect((await sh(f.provider, id, "echo alive")).stdout).toBe("alive\n");
  });

  it("pause is idempotent, resume of a started sandbox is a no-op, and a stopped sandbox cannot be paused", async () => {
    const id = await make("idem");
    await f.provider.pause(id);
    expect((await f.provider.pause(id)).state).toBe("paused");
    expect((await f.provider.list()).find((i) => i.id === id)?.state).toBe("paused");
    expect((await f.provider.resume(id)).state).toBe("started");
    expect((await f.provider.resume(id)).state).toBe("started");
    await f.provider.stop(id);
    await expectCode(f.provider.pause(id), Code.FailedPrecondition);
  });

  it("stop and destroy of a paused sandbox end every process", async () => {
    const stopped = await make("pstop");
    await sh(f.provider, stopped, "(sleep 600 >/dev/null 2>&1 &)");
    const { hostUid } = await f.provider.pause(stopped);
    expect((await f.provider.stop(stopped)).state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
    expect((await f.provider.start(stopped)).state).toBe("started");

    const destroyed = await make("pdestroy");
    const d = await f.provider.pause(destroyed);
    await f.provider.destroy(destroyed);
    created.delete(destroyed);
    expect(await processesOfUid(d.hostUid)).toEqual([]);
    expect(await f.provider.cgroups.exists(destroyed)).toBe(false);
  });

  it("a paused sandbox stays paused under a new provider on the same data dir, which can resume it", async () => {
    const id = await make("preadopt");
    await sh(f.provider, id, "echo before > /tmp/mark");
    await f.provider.pause(id);
    const again = await LinuxProvider.open({ dataDir: f.dataDir, uidBase: (await f.provider.inspect(id)).hostUid - 10, uidCount: 1024 });
    const listed = (await again.list()).find((i) => i.id === id);
    expect(listed?.state).toBe("paused");
    expect(listed?.paused?.residentBytes).toBeGreaterThan(0);
    expect(await again.cgroups.frozen(id)).toBe(true); // not thawed nor torn down by the new provider's start
    expect((await again.resume(id)).state).toBe("started");
    expect((await retry(() => sh(again, id, "cat /tmp/mark"))).stdout).toBe("before\n");
  });
});
