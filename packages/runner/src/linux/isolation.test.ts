import { chmod, lstat, mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Fixture } from "./testing/harness.ts";
import { fixture, request, sh, uniqueId } from "./testing/harness.ts";
import { disposeFixture } from "../testing/dispose.ts";

// What a process inside a sandbox can see and do: real sandboxes on the host-/usr rootfs.

let f: Fixture;
const a = uniqueId("iso-a");
const b = uniqueId("iso-b");
const r = uniqueId("iso-root");

beforeAll(async () => {
  f = await fixture();
  // Base files a sandbox may modify (world-writable): the overlay must keep the base intact.
  const shared = path.join(f.rootfs, "srv/shared");
  await mkdir(shared, { recursive: true });
  await chmod(shared, 0o777);
  await writeFile(path.join(shared, "base.txt"), "base\n", { mode: 0o666 });
  await writeFile(path.join(shared, "gone.txt"), "doomed\n", { mode: 0o666 });
  await chmod(path.join(shared, "base.txt"), 0o666);
  await chmod(path.join(shared, "gone.txt"), 0o666);
  await f.provider.create(f.spec(a, { env: { GREETING: "hello from a" }, init: { ...f.spec(a).init, secret: "s3cret-a" } }));
  await f.provider.create(f.spec(b));
  await f.provider.create(f.spec(r, { user: "root" }));
  await Promise.all([f.provider.start(a), f.provider.start(b), f.provider.start(r)]);
});

afterAll(() => disposeFixture(f, [a, b, r]));

describe("linux sandbox isolation", () => {
  it("ps sees only the sandbox's own processes, with the agent under pid 1", async () => {
    const res = await sh(f.provider, a, "ps -e -o pid=,comm=");
    expect(res.code).toBe(0);
    const procs = res.stdout.trim().split("\n").map((l) => l.trim().split(/\s+/));
    const comms = new Set(procs.map((p) => p[1]));
    expect([...comms].filter((c) => !["init-sh", "node", "MainThread", "sh", "ps"].includes(c))).toEqual([]);
    expect(procs.map((p) => Number(p[0]))).toContain(1);
    expect(procs.length).toBeLessThan(8);
    // The host has many more; make sure we are not looking at them.
    expect(Math.max(...procs.map((p) => Number(p[0])))).toBeLessThan(100);
  });

  it("shows no host path in its mount table: not the data dir, the snapshot, the agent or node", async () => {
    const res = await sh(f.provider, a, "cat /proc/self/mountinfo; findmnt -n -o SOURCE,OPTIONS / 2>/dev/null || true");
    expect(res.code).toBe(0);
    const spec = f.spec(a);
    for (const hostPath of [f.dataDir, f.rootfs, spec.init.node, spec.init.bundle, process.cwd()]) expect(res.stdout).not.toContain(hostPath);
    expect(res.stdout).toMatch(/ \/ \/ .* overlay overlay .*lowerdir=l0:l1,upperdir=upper,workdir=work/);
    // The agent still runs from the runner's files, now a read-only layer of the root.
    const ls = await sh(f.provider, a, "test -x /opt/sandbar/bin/node && ! touch /opt/sandbar/bin/node 2>/dev/null && echo ok");
    expect(ls.stdout.trim()).toBe("ok");
  });

  it("has only the loopback interface, and it is up", async () => {
    const res = await sh(f.provider, a, "ip -o link show; echo ---; cat /proc/net/dev");
    expect(res.code).toBe(0);
    const [links, dev] = res.stdout.split("---\n");
    const names = links.trim().split("\n").map((l) => l.split(":")[1].trim());
    expect(names).toEqual(["lo"]);
    expect(links).toContain("UP");
    const devNames = dev.trim().split("\n").slice(2).map((l) => l.split(":")[0].trim());
    expect(devNames).toEqual(["lo"]);
  });

  it("runs as an unprivileged user with every capability dropped", async () => {
    const res = await sh(f.provider, a, "id -u; id -un; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; cat /proc/self/status | grep NoNewPrivs");
    const lines = res.stdout.trim().split("\n");
    expect(lines[0]).toBe("1000");
    expect(lines[1]).toBe("sandbar");
    const caps = Object.fromEntries(lines.slice(2, 7).map((l) => l.split(":\t")));
    expect(caps).toEqual({ CapInh: "0000000000000000", CapPrm: "0000000000000000", CapEff: "0000000000000000", CapBnd: "0000000000000000", CapAmb: "0000000000000000" });
    expect(lines[7]).toMatch(/NoNewPrivs:\s+1/);
  });

  it("cannot create nested user namespaces (no way to regain capabilities)", async () => {
    const res = await sh(f.provider, a, "unshare -U true && echo nested-ok || echo nested-denied");
    expect(res.stdout).toBe("nested-denied\n");
  });

  it("user root is uid 0 inside but still has no capabilities and cannot write the base", async () => {
    const res = await sh(f.provider, r, "id -u; grep CapEff /proc/self/status; echo x >> /etc/passwd && echo wrote || echo denied; echo hi > ~/mine && cat ~/mine");
    expect(res.stdout.trim().split("\n")).toEqual(["0", "CapEff:\t0000000000000000", "denied", "hi"]);
  });

  it("sees none of the host's environment, only its own plus PATH/HOME/USER and its CPU quota for nproc", async () => {
    const res = await sh(f.provider, a, "env");
    const keys = res.stdout.trim().split("\n").map((l) => l.split("=")[0]).sort();
    expect(keys).toEqual(["GREETING", "HOME", "OMP_NUM_THREADS", "PATH", "PWD", "USER"]);
    expect(res.stdout).toContain("GREETING=hello from a");
    expect(res.stdout).toContain("HOME=/home/sandbar");
    for (const hostKey of Object.keys(process.env)) if (!["HOME", "PATH", "PWD", "USER"].includes(hostKey)) expect(keys).not.toContain(hostKey);
  });

  it("writes go to the sandbox's upper layer and never change the base", async () => {
    const res = await sh(f.provider, a, "echo changed > /srv/shared/base.txt && rm /srv/shared/gone.txt && echo new > /srv/shared/new.txt && cat /srv/shared/base.txt && ls /srv/shared");
    expect(res.code).toBe(0);
    expect(res.stdout).toBe("changed\nbase.txt\nnew.txt\n");
    const shared = path.join(f.rootfs, "srv/shared");
    expect(await readFile(path.join(shared, "base.txt"), "utf8")).toBe("base\n");
    expect(await readFile(path.join(shared, "gone.txt"), "utf8")).toBe("doomed\n");
    await expect(lstat(path.join(shared, "new.txt"))).rejects.toThrow();
    // The deletion is a whiteout (0/0 character device) in the upper layer.
    const upper = f.provider.layout.upper(a, false);
    const whiteout = await lstat(path.join(upper, "srv/shared/gone.txt"));
    expect(whiteout.isCharacterDevice()).toBe(true);
    expect(await readFile(path.join(upper, "srv/shared/new.txt"), "utf8")).toBe("new\n");
    // The other sandbox still sees the base.
    const other = await sh(f.provider, b, "cat /srv/shared/base.txt /srv/shared/gone.txt");
    expect(other.stdout).toBe("base\ndoomed\n");
  });

  it("files are owned by the sandbox's own host uid, distinct per sandbox", async () => {
    await sh(f.provider, a, "echo mine > ~/owned.txt");
    const infoA = await f.provider.inspect(a);
    const infoB = await f.provider.inspect(b);
    expect(infoA.hostUid).not.toBe(infoB.hostUid);
    const st = await lstat(path.join(f.provider.layout.upper(a, false), "home/sandbar/owned.txt"));
    expect(st.uid).toBe(infoA.hostUid);
  });

  it("another sandbox's files and processes are invisible", async () => {
    await sh(f.provider, a, "echo top-secret > /tmp/a-secret && echo x > ~/a-home-file && sleep 300 >/dev/null 2>&1 &");
    const res = await sh(f.provider, b, "ls /tmp/a-secret ~/a-home-file 2>&1; find / -xdev -name 'a-secret' -o -xdev -name 'a-home-file' 2>/dev/null; ps -e -o comm=; ls /run/sandbar");
    expect(res.stdout).toContain("No such file or directory");
    expect(res.stdout).not.toMatch(/^\/.*a-secret$/m);
    expect(res.stdout).not.toMatch(/^sleep$/m);
    expect(res.stdout).toMatch(/^agent\.sock$/m);
    // Nor the host's: the data dir, the runtime dir and the host's home are not in its tree.
    const host = await sh(f.provider, b, `ls ${f.dataDir} ${f.provider.layout.runtimeDir} /root/.. 2>&1; ls /`);
    expect(host.stdout).toContain(`ls: cannot access '${f.dataDir}': No such file or directory`);
    expect(host.stdout).toContain(`ls: cannot access '${f.provider.layout.runtimeDir}': No such file or directory`);
  });

  it("has its own hostname, cgroup namespace, ipc namespace and a writable /dev/shm", async () => {
    const res = await sh(f.provider, a, "hostname; cat /proc/self/cgroup | grep -c ':/$'; cat /proc/self/cgroup | wc -l; stat -c %a /dev/shm; echo x > /dev/shm/x && echo shm-ok; readlink /proc/self/ns/ipc");
    const [hostname, rootLines, allLines, shmMode, shmOk, ipcNs] = res.stdout.trim().split("\n");
    expect(hostname).toBe(a);
    expect(rootLines).toBe(allLines);
    expect(shmMode).toBe("1777");
    expect(shmOk).toBe("shm-ok");
    const { readlink } = await import("node:fs/promises");
    expect(ipcNs).not.toBe(await readlink("/proc/self/ns/ipc"));
  });

  it("passes the secret as a file only the sandbox can read", async () => {
    const socket = await f.provider.connect(a);
    const res = await request<{ secret: string | null }>(socket, { secret: true });
    expect(res.secret).toBe("s3cret-a");
    const info = await f.provider.inspect(a);
    expect(info.spec.init.secret).toBeUndefined();
    expect(await readFile(f.provider.layout.stateFile(a), "utf8")).toContain("s3cret-a"); // kept root-only on disk
    expect(((await lstat(f.provider.layout.stateFile(a))).mode & 0o077)).toBe(0);
  });

  it("reports the mounts it made on the host only under its runtime dir", async () => {
    const mountinfo = await readFile("/proc/self/mountinfo", "utf8");
    expect(mountinfo).toContain(` ${f.provider.layout.rootMount(a)} `);
    // The binds bwrap made live in the sandbox's own mount namespace, not the host's.
    expect(mountinfo).not.toContain(`${f.provider.layout.rootMount(a)}/opt/sandbar`);
  });
});
