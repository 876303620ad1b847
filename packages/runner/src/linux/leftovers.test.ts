import { existsSync } from "node:fs";
import { readFile, rm, truncate, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { run } from "../host/command.ts";
import { loopDevicesUnder } from "./leftovers.ts";
import type { NetworkLease } from "../host/network.ts";
import { LinuxProvider } from "./provider.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, leftovers, retry, sandboxInit, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// A runner opened on a data dir removes what an earlier one left there (LinuxProvider
// .removeLeftovers): real processes, overlay and loop mounts, cgroups, network namespaces, veths
// and nftables chains, made by real sandboxes and then orphaned as a crash or a deleted data dir
// orphans them. Sandboxes that run, and the files of those that are recorded, stay.

const isRoot = process.getuid?.() === 0;
let f: Fixture;
const created = new Set<string>();

beforeAll(async () => {
  if (isRoot) f = await fixture();
});

afterAll(async () => {
  // The sweep itself is under test: whatever a failed run left is removed the ordinary way too.
  await disposeFixture(f, created);
});

async function make(prefix: string, over: Parameters<Fixture["spec"]>[1] = {}): Promise<{ id: string; hostUid: number }> {
  const id = uniqueId(prefix);
  created.add(id);
  const { hostUid } = await f.provider.create(f.spec(id, { diskGiB: 1, ...over }));
  await f.provider.start(id);
  return { id, hostUid };
}

async function lease(id: string): Promise<NetworkLease> {
  return JSON.parse(await readFile(path.join(f.provider.layout.runtime(id), "network.json"), "utf8")) as NetworkLease;
}

/** What of a sandbox's network is still on the host. */
async function networkLeftovers(l: NetworkLease): Promise<string[]> {
  const found: string[] = [];
  if (l.netns && existsSync(`/run/netns/${l.netns}`)) found.push(`netns ${l.netns}`);
  if (existsSync(`/sys/class/net/${l.hostIf}`)) found.push(`link ${l.hostIf}`);
  const table = (await run("nft", ["list", "table", "inet", "sandbar"])).stdout;
  if (new RegExp(`chain s${l.slot} \\{`).test(table)) found.push(`chain s${l.slot}`);
  if (table.includes(`"${l.hostIf}" : jump`)) found.push(`map element ${l.hostIf}`);
  return found;
}

it.skipIf(!isRoot)("a runner opened on the data dir removes what earlier ones left, and only that", { timeout: 120_000 }, async () => {
  const L = f.provider.layout;
  // 1. A sandbox whose record and disk image were deleted under it while it ran (a data dir
  //    removed by hand): its processes, overlay, disk mount, loop device (of a deleted file),
  //    cgroup and network are remains.
  const orphan = await make("orphan", { network: "full" });
  const orphanLease = await lease(orphan.id);
  await rm(L.stateFile(orphan.id));
  await rm(L.diskImage(orphan.id));
  // 2. A recorded sandbox whose processes died with nothing undone (a runner killed mid-stop).
  const died = await make("died");
  process.kill((await sandboxInit(f.provider, died.id))!, "SIGKILL"); // the namespace goes with it; its bwrap is reaped
  await retry(async () => expect(await f.provider.cgroups.pids(died.id)).toEqual([]));
  // 3. A loop device attached to a file of the data dir that nothing mounts.
  const image = path.join(f.dataDir, "stray.img");
  await writeFile(image, "");
  await truncate(image, 1 << 20);
  const stray = (await run("losetup", ["--find", "--show", image])).stdout.trim();
  // 4. A running sandbox, and one nothing claims (the caller says so: a warm pool of an earlier run).
  const live = await make("live");
  const unclaimed = await make("unclaimed");

  expect(await leftovers(f.provider, orphan.id, orphan.hostUid)).not.toEqual([]);
  expect(await networkLeftovers(orphanLease)).toHaveLength(4);
  expect((await loopDevicesUnder(f.dataDir)).map((l) => l.device)).toContain(stray);

  const log: string[] = [];
  const again = await LinuxProvider.open({ dataDir: f.dataDir, uidBase: live.hostUid - 10, uidCount: 1024, log: (l) => log.push(l) });
  try {
    expect(await again.removeLeftovers([unclaimed.id])).toEqual([unclaimed.id]);
  } finally {
    await again.close();
  }

  expect(await leftovers(f.provider, orphan.id, orphan.hostUid)).toEqual([]);
  expect(await networkLeftovers(orphanLease)).toEqual([]);
  expect(await leftovers(f.provider, unclaimed.id, unclaimed.hostUid)).toEqual([]);
  // The dead one keeps its files and record (its row may want it started again), nothing else.
  expect(await leftovers(f.provider, died.id, died.hostUid)).toEqual([`directory ${L.sandboxDir(died.id)}`]);
  // The dead one's loop device goes once the kernel has released its unmounted file system
  // (asynchronously, and later under load): waited for, with retry's deadline.
  const liveLoop = (await loopDevicesUnder(L.sandboxDir(live.id)))[0]!.device;
  await retry(async () => expect((await loopDevicesUnder(f.dataDir)).map((l) => l.device)).toEqual([liveLoop]), 30_000);
  expect((await sh(f.provider, live.id, "echo alive")).stdout).toBe("alive\n");

  // At open: the orphan's remains, the dead one's mounts and cgroup, the stray device; then the unclaimed one.
  const text = log.join("\n");
  expect(text).toContain(`leftovers: removed the remains of 1 sandbox(es) with no record: ${orphan.id}`);
  expect(text).toMatch(/leftovers: killed [1-9]\d* processes of sandboxes/);
  expect(text).toContain("leftovers: removed 4 mounts (overlay roots, disk images, volumes)"); // the orphan's two, the dead one's two
  expect(text).toContain("leftovers: removed 3 loop devices (1 of them backed by deleted files)");
  expect(text).toContain("leftovers: removed 2 sandbox cgroups");
  expect(text).toContain("leftovers: removed 1 nftables chain");
  expect(text).toContain("leftovers: removed 1 veth");
  expect(text).toContain("leftovers: removed 1 network namespace");
  expect(text).toContain(`leftovers: removed 1 sandbox(es) nothing claims: ${unclaimed.id}`);

  // The dead one starts again from its files.
  await f.provider.start(died.id);
  expect((await sh(f.provider, died.id, "echo back")).stdout).toBe("back\n");
});
