import { createReadStream, createWriteStream } from "node:fs";
import { copyFile, link, lstat, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { Code, ConnectError } from "@sandbar/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LinuxProvider } from "./provider.ts";
import type { Fixture } from "./testing/harness.ts";
import { fixture, leftovers, processesOfUid, retry, sandboxInit, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// create / start / stop / destroy, the writable layer's pack and restore, and picking sandboxes
// up again from disk.

let f: Fixture;
const created = new Set<string>();

beforeAll(async () => {
  f = await fixture();
  await mkdir(path.join(f.rootfs, "srv/shared/dir"), { recursive: true, mode: 0o777 });
  await writeFile(path.join(f.rootfs, "srv/shared/dir/old.txt"), "old\n", { mode: 0o666 });
  await writeFile(path.join(f.rootfs, "srv/shared/gone.txt"), "gone\n", { mode: 0o666 });
  await import("node:fs/promises").then((fs) => Promise.all([fs.chmod(path.join(f.rootfs, "srv/shared"), 0o777), fs.chmod(path.join(f.rootfs, "srv/shared/dir"), 0o777)]));
});

afterAll(() => disposeFixture(f, created));

async function make(prefix: string, over: Parameters<Fixture["spec"]>[1] = {}, start = true): Promise<string> {
  const id = uniqueId(prefix);
  created.add(id);
  await f.provider.create(f.spec(id, over));
  if (start) await f.provider.start(id);
  return id;
}

async function expectCode(p: Promise<unknown>, code: Code, text?: string): Promise<void> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ConnectError);
  expect((err as ConnectError).code).toBe(code);
  if (text) expect((err as ConnectError).message).toContain(text);
}

describe("linux sandbox lifecycle", () => {
  it("create prepares without starting; start waits for the agent's socket", async () => {
    const id = await make("life", {}, false);
    const info = await f.provider.inspect(id);
    expect(info.state).toBe("created");
    expect(info.usage).toBeUndefined();
    await expectCode(f.provider.connect(id), Code.FailedPrecondition, "not started");
    const started = await f.provider.start(id);
    expect(started.state).toBe("started");
    expect(started.startedAt).toBeInstanceOf(Date);
    const socket = await f.provider.connect(id);
    expect((await lstat(socket)).isSocket()).toBe(true);
    expect(socket.startsWith(f.provider.layout.runtime(id))).toBe(true);
    // Starting a started sandbox is a no-op.
    expect((await f.provider.start(id)).startedAt).toEqual(started.startedAt);
  });

  it("stop kills everything and unmounts; start brings the files back", async () => {
    const id = await make("stopstart");
    const { hostUid } = await f.provider.inspect(id);
    await sh(f.provider, id, "echo kept > ~/kept.txt && echo tmp > /tmp/t && rm /srv/shared/gone.txt && (sleep 600 >/dev/null 2>&1 &)");
    const stopped = await f.provider.stop(id);
    expect(stopped.state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
    expect(await leftovers(f.provider, id, hostUid)).toEqual([`directory ${f.provider.layout.sandboxDir(id)}`]);
    await expectCode(f.provider.connect(id), Code.FailedPrecondition);
    await f.provider.start(id);
    const res = await sh(f.provider, id, "cat ~/kept.txt /tmp/t; ls /srv/shared; ps -e -o comm= | grep -c sleep");
    expect(res.stdout).toBe("kept\ntmp\ndir\n0\n");
  });

  it("stop/start keeps files on a disk-capped sandbox too", async () => {
    const id = await make("diskkeep", { diskGiB: 0.05 });
    await sh(f.provider, id, "echo on-disk > ~/d.txt");
    await f.provider.stop(id);
    expect(await leftovers(f.provider, id, (await f.provider.inspect(id)).hostUid)).toEqual([`directory ${f.provider.layout.sandboxDir(id)}`]);
    await f.provider.start(id);
    expect((await sh(f.provider, id, "cat ~/d.txt")).stdout).toBe("on-disk\n");
  });

  it("restarts an agent that died; reports a sandbox whose first process died as error, and start recovers it", async () => {
    const id = await make("crash");
    await sh(f.provider, id, "echo kept > ~/kept");
    // The agent dies while answering: the request itself fails, and its supervisor restarts it.
    await sh(f.provider, id, "kill -9 $PPID").catch(() => undefined);
    expect((await retry(() => sh(f.provider, id, "echo again"))).stdout).toBe("again\n");
    const restarted = await f.provider.inspect(id);
    expect(restarted.state).toBe("started");
    expect(restarted.agent).toMatchObject({ running: true, restarts: 1 });
    // The sandbox's pid 1 itself killed (from the host): the sandbox is in error.
    process.kill((await sandboxInit(f.provider, id))!, "SIGKILL");
    let info = await f.provider.inspect(id);
    for (let i = 0; i < 100 && info.state !== "error"; i++) {
      await new Promise((r) => setTimeout(r, 20));
      info = await f.provider.inspect(id);
    }
    expect(info.state).toBe("error");
    expect(info.error).toMatch(/first process/);
    const again = await f.provider.start(id);
    expect(again.state).toBe("started");
    expect((await sh(f.provider, id, "cat ~/kept")).stdout).toBe("kept\n");
    expect((await f.provider.inspect(id)).agent).toMatchObject({ running: true, restarts: 0 });
  });

  it("pack and restore round-trip the writable layer: contents, modes, links, whiteouts, opaque dirs, owners", async () => {
    const src = await make("pack-src");
    const script = [
      "mkdir -p ~/proj/sub && echo hello > ~/proj/sub/a.txt && chmod 600 ~/proj/sub/a.txt",
      "ln -s sub/a.txt ~/proj/link",
      "head -c 3000000 /dev/urandom > ~/proj/blob && sha256sum ~/proj/blob | cut -c1-64 > ~/proj/blob.sum",
      "rm /srv/shared/gone.txt",
      "rm -r /srv/shared/dir && mkdir /srv/shared/dir && echo fresh > /srv/shared/dir/new.txt",
    ].join(" && ");
    expect((await sh(f.provider, src, script)).code).toBe(0);
    await f.provider.stop(src);
    const archive = path.join(f.dataDir, "layer.tar");
    await pipeline(await f.provider.pack(src), createWriteStream(archive));

    const dst = await make("pack-dst", {}, false);
    await f.provider.restore(dst, createReadStream(archive));
    await f.provider.start(dst);
    const check = [
      "cat ~/proj/sub/a.txt",
      "stat -c '%a %U' ~/proj/sub/a.txt",
      "readlink ~/proj/link",
      "sha256sum ~/proj/blob | cut -c1-64 | cmp - ~/proj/blob.sum && echo blob-ok",
      "ls /srv/shared /srv/shared/dir",
    ].join("; ");
    const res = await sh(f.provider, dst, check);
    expect(res.stdout).toBe("hello\n600 sandbar\nsub/a.txt\nblob-ok\n/srv/shared:\ndir\n\n/srv/shared/dir:\nnew.txt\n");
    // Owned by the destination's host uid, not the source's.
    const dstUid = (await f.provider.inspect(dst)).hostUid;
    const st = await lstat(path.join(f.provider.layout.upper(dst, false), "home/sandbar/proj/sub/a.txt"));
    expect(st.uid).toBe(dstUid);
    expect(dstUid).not.toBe((await f.provider.inspect(src)).hostUid);
  });

  it("packs a running sandbox and a stopped disk-capped one, and restores into a disk-capped sandbox", async () => {
    const running = await make("pack-live");
    await sh(f.provider, running, "echo live > ~/live.txt");
    const live = path.join(f.dataDir, "live.tar");
    await pipeline(await f.provider.pack(running), createWriteStream(live));
    expect((await f.provider.inspect(running)).state).toBe("started");

    const capped = await make("pack-disk", { diskGiB: 0.05 });
    await sh(f.provider, capped, "echo capped > ~/capped.txt");
    await f.provider.stop(capped);
    const cappedTar = path.join(f.dataDir, "capped.tar");
    await pipeline(await f.provider.pack(capped), createWriteStream(cappedTar));
    expect(await leftovers(f.provider, capped, (await f.provider.inspect(capped)).hostUid)).toEqual([`directory ${f.provider.layout.sandboxDir(capped)}`]);

    const target = await make("restore-disk", { diskGiB: 0.05 }, false);
    await f.provider.restore(target, createReadStream(cappedTar));
    await f.provider.start(target);
    expect((await sh(f.provider, target, "cat ~/capped.txt")).stdout).toBe("capped\n");
    await f.provider.stop(target);
    await f.provider.restore(target, createReadStream(live));
    await f.provider.start(target);
    expect((await sh(f.provider, target, "cat ~/live.txt; ls ~")).stdout).toBe("live\nlive.txt\n");
  });

  it("refuses to restore into a running sandbox, and reports a broken archive", async () => {
    const id = await make("restore-bad");
    await expectCode(f.provider.restore(id, Readable.from([Buffer.from("x")])), Code.FailedPrecondition, "stop it");
    await f.provider.stop(id);
    await expectCode(f.provider.restore(id, Readable.from([Buffer.alloc(10_000, 7)])), Code.FailedPrecondition, "restoring the writable layer failed");
    // A source that breaks off midway (a client going away) fails the restore too.
    const good = path.join(f.dataDir, "breaks.tar");
    await pipeline(await f.provider.pack(id), createWriteStream(good));
    const bytes = await readFile(good);
    let reads = 0;
    const breaking = new Readable({
      read() {
        // First read: a valid start of the archive; the next one: the client goes away.
        if (reads++ === 0) this.push(bytes.subarray(0, 1024));
        else setImmediate(() => this.destroy(new Error("client went away")));
      },
    });
    await expectCode(f.provider.restore(id, breaking), Code.FailedPrecondition, "restoring the writable layer failed");
    // One that failed before the restore even began.
    const failed = new Readable({ read() {} });
    failed.on("error", () => undefined);
    failed.destroy(new Error("upload aborted"));
    await expectCode(f.provider.restore(id, failed), Code.FailedPrecondition, "upload aborted");
    // After all that, a good archive still restores and the sandbox starts.
    await f.provider.restore(id, createReadStream(good));
    expect((await f.provider.start(id)).state).toBe("started");
  });

  it("destroy leaves no mount, cgroup, process, loop device or directory behind", async () => {
    const plain = await make("destroy");
    const capped = await make("destroy-disk", { diskGiB: 0.05 });
    for (const id of [plain, capped]) {
      await sh(f.provider, id, "sleep 600 >/dev/null 2>&1 & echo x > ~/f");
      const { hostUid } = await f.provider.inspect(id);
      expect((await leftovers(f.provider, id, hostUid)).length).toBeGreaterThan(2);
      await f.provider.destroy(id);
      created.delete(id);
      expect(await leftovers(f.provider, id, hostUid)).toEqual([]);
      await expectCode(f.provider.inspect(id), Code.NotFound);
    }
    // Unknown ids are fine (destroy is idempotent).
    await f.provider.destroy(uniqueId("never"));
  });

  it("a new provider on the same data dir finds its sandboxes and can operate them", async () => {
    const id = await make("adopt");
    const stopped = await make("adopt-stopped");
    await f.provider.stop(stopped);
    const again = await LinuxProvider.open({ dataDir: f.dataDir, uidBase: (await f.provider.inspect(id)).hostUid - 10, uidCount: 1024 });
    const listed = new Map((await again.list()).map((i) => [i.id, i.state]));
    expect(listed.get(id)).toBe("started");
    expect(listed.get(stopped)).toBe("stopped");
    expect((await sh(again, id, "echo adopted")).stdout).toBe("adopted\n");
    const { hostUid } = await again.inspect(id);
    expect((await again.stop(id)).state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
  });

  it("starts several sandboxes at once", async () => {
    const ids = await Promise.all([1, 2, 3, 4].map(() => make("par", {}, false)));
    const infos = await Promise.all(ids.map((id) => f.provider.start(id)));
    expect(infos.map((i) => i.state)).toEqual(["started", "started", "started", "started"]);
    const outs = await Promise.all(ids.map((id) => sh(f.provider, id, "hostname")));
    expect(outs.map((o) => o.stdout.trim())).toEqual(ids);
  });

  it("rejects bad specs and unknown sandboxes with clear errors", async () => {
    await expectCode(f.provider.create(f.spec("bad id")), Code.InvalidArgument, "sandbox id");
    await expectCode(f.provider.create(f.spec(uniqueId("x"), { cpu: 0 })), Code.InvalidArgument, "cpu");
    await expectCode(f.provider.create(f.spec(uniqueId("x"), { network: "nat" as "none" })), Code.InvalidArgument, "network mode");
    await expectCode(f.provider.create(f.spec(uniqueId("x"), { rootfs: "/nonexistent/rootfs" })), Code.FailedPrecondition, "does not exist");
    await expectCode(
      f.provider.create(f.spec(uniqueId("x"), { init: { node: process.execPath, bundle: path.dirname(process.execPath) } })),
      Code.InvalidArgument,
      "init.main is required",
    );
    await expectCode(
      f.provider.create(f.spec(uniqueId("x"), { mounts: [{ source: "/usr", target: "/run" }] })),
      Code.InvalidArgument,
      "reserved",
    );
    // A bind source below a directory the sandbox uid cannot search (the data dir is 0700).
    await expectCode(
      f.provider.create(f.spec(uniqueId("x"), { mounts: [{ source: path.join(f.rootfs, "etc"), target: "/mnt/etc" }] })),
      Code.FailedPrecondition,
      "not reachable by sandbox users",
    );
    const id = await make("dup", {}, false);
    await expectCode(f.provider.create(f.spec(id)), Code.AlreadyExists);
    await expectCode(f.provider.inspect("unknown-sandbox"), Code.NotFound);
    await expectCode(f.provider.start("unknown-sandbox"), Code.NotFound);
    await expectCode(f.provider.pack("unknown-sandbox"), Code.NotFound);
  });

  it("runs an agent whose node and bundle live in a private directory (nvm under /root)", async () => {
    // The agent is a lower layer of the root, read with the runner's credentials: no bind source
    // has to be reachable by the sandbox uid.
    const home = path.join(f.dataDir, "private-home");
    await mkdir(home, { mode: 0o700 });
    const node = path.join(home, "node");
    await link(process.execPath, node).catch(() => copyFile(process.execPath, node));
    const bundle = path.join(home, "agent.mjs");
    await copyFile(f.spec("x").init.bundle, bundle);
    const id = await make("private", { init: { node, bundle } });
    expect((await sh(f.provider, id, "echo ok")).stdout).toBe("ok\n");
  });

  it("fails start clearly when the first process never listens", async () => {
    const script = path.join(path.dirname(f.spec("x").init.bundle), "silent-agent.mjs");
    await writeFile(script, "console.error('not listening'); process.exit(3);\n", { mode: 0o644 });
    const id = await make("silent", { init: { node: process.execPath, bundle: script } }, false);
    await expectCode(f.provider.start(id, { timeoutMs: 5000 }), Code.FailedPrecondition, "not listening");
    const info = await f.provider.inspect(id);
    expect(info.state).toBe("created");
    expect(await leftovers(f.provider, id, info.hostUid)).toEqual([`directory ${f.provider.layout.sandboxDir(id)}`]);
    await rm(script);
  });
});
