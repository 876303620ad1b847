import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, readFile, writeFile, chmod } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { Code, ConnectError } from "@sandbar/protocol";
import { readChangeset } from "../host/changeset.ts";
import { expect, it } from "vitest";
import type { SandboxProvider, SandboxSpec } from "../provider.ts";
import { processesOfUid, retry, sh, uniqueId } from "../linux/testing/harness.ts";

// What every provider must do, whatever makes its sandboxes: one set of cases, run against each
// provider (linux, docker, docker with gVisor) by provider-contract.test.ts. Only the provider
// interface, the exec agent and host-side observations (processes of the sandbox's uid) are used.

export interface ProviderFixture<P extends SandboxProvider = SandboxProvider> {
  provider: P;
  dataDir: string;
  rootfs: string;
  spec(id: string, over?: Partial<SandboxSpec>): SandboxSpec;
  /** A new provider object on the same data dir (a restarted runner). */
  reopen(): Promise<P>;
  /** Host pid of the sandbox's first process (its pid 1), while it runs. */
  initPid(id: string): Promise<number | undefined>;
}

export async function expectCode(p: Promise<unknown>, code: Code, text?: string): Promise<void> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ConnectError);
  expect((err as ConnectError).code).toBe(code);
  if (text) expect((err as ConnectError).message).toContain(text);
}

/** Registers the contract's cases; `get` returns the suite's fixture (made in its beforeAll). */
export function providerContract(get: () => ProviderFixture, created: Set<string>, options: { gvisor?: boolean } = {}): void {
  const f = () => get();
  async function make(prefix: string, over: Partial<SandboxSpec> = {}, start = true): Promise<string> {
    const id = uniqueId(prefix);
    created.add(id);
    await f().provider.create(f().spec(id, over));
    if (start) await f().provider.start(id);
    return id;
  }

  it("create prepares without starting; start waits for the agent; a second start is a no-op", async () => {
    const { provider } = f();
    const id = await make("life", {}, false);
    expect((await provider.inspect(id)).state).toBe("created");
    await expectCode(provider.connect(id), Code.FailedPrecondition, "not started");
    const started = await provider.start(id);
    expect(started.state).toBe("started");
    expect(started.usage?.memoryLimitBytes).toBe(0.5 * 2 ** 30);
    expect(started.usage?.pidsLimit).toBe(256);
    expect(started.agent).toMatchObject({ running: true, restarts: 0 });
    expect((await sh(provider, id, "echo hi; hostname")).stdout).toBe(`hi\n${id}\n`);
    expect((await provider.start(id)).startedAt).toEqual(started.startedAt);
  });

  it("stop ends every process and keeps the files; start brings them back", async () => {
    const { provider } = f();
    const id = await make("stopstart");
    const { hostUid } = await provider.inspect(id);
    await sh(provider, id, "echo kept > ~/kept.txt && echo tmp > /tmp/t && (sleep 600 >/dev/null 2>&1 &)");
    if (!options.gvisor) expect(await processesOfUid(hostUid)).not.toEqual([]);
    expect((await provider.stop(id)).state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
    await expectCode(provider.connect(id), Code.FailedPrecondition);
    await provider.start(id);
    // gVisor mounts a tmpfs of its own at /tmp: only the home survives there.
    const kept = options.gvisor ? "cat ~/kept.txt" : "cat ~/kept.txt /tmp/t";
    expect((await sh(provider, id, `${kept}; ps -e -o comm= | grep -c sleep`)).stdout).toBe(options.gvisor ? "kept\n0\n" : "kept\ntmp\n0\n");
  });

  // gVisor: the sentry's own threads count against the pids limit (64 cannot even boot it).
  const unlessGvisor = options.gvisor ? it.skip : it;

  /**
   * Under gVisor the host side of the agent's socket (--host-uds) outlives the agent for a moment:
   * a connection made then is accepted and never answered. Clients time out; the test waits it out.
   */
  const restartWindow = () => (options.gvisor ? new Promise((r) => setTimeout(r, 1500)) : Promise.resolve());

  it("restarts an agent that died; a sandbox whose pid 1 died is in error, and start recovers it", async () => {
    const { provider } = f();
    const id = await make("crash");
    await sh(provider, id, "echo kept > ~/kept");
    await sh(provider, id, "kill -9 $PPID").catch(() => undefined);
    await restartWindow();
    expect((await retry(() => sh(provider, id, "echo again"))).stdout).toBe("again\n");
    expect((await provider.inspect(id)).agent).toMatchObject({ running: true, restarts: 1 });
    process.kill((await f().initPid(id))!, "SIGKILL");
    let info = await provider.inspect(id);
    for (let i = 0; i < 200 && info.state !== "error"; i++) {
      await new Promise((r) => setTimeout(r, 25));
      info = await provider.inspect(id);
    }
    expect(info.state).toBe("error");
    expect(info.error).toMatch(/first process/);
    expect((await provider.start(id)).state).toBe("started");
    expect((await sh(provider, id, "cat ~/kept")).stdout).toBe("kept\n");
  });

  it("passes the secret as a file only the sandbox reads, and the environment; setEnv applies at the next start", async () => {
    const { provider } = f();
    const id = await make("secret", { env: { GREETING: "it's $HOME `x`" }, init: { ...f().spec("x").init, secret: "s3cr3t" } });
    expect((await sh(provider, id, 'cat /run/sandbar/secret; echo; printf "%s\\n" "$GREETING"')).stdout).toBe("s3cr3t\nit's $HOME `x`\n");
    expect(JSON.stringify(await provider.inspect(id))).not.toContain("s3cr3t");
    await provider.setEnv(id, { OTHER: "two" });
    expect((await sh(provider, id, 'echo "[$OTHER]"')).stdout).toBe("[]\n");
    await provider.stop(id);
    await provider.start(id);
    expect((await sh(provider, id, 'echo "[$OTHER][$GREETING]"')).stdout).toBe("[two][]\n");
  });

  it("runs as an unprivileged host uid with no capabilities, no new privileges, its own pids and loopback only", async () => {
    const { provider } = f();
    const id = await make("iso");
    const { hostUid } = await provider.inspect(id);
    const status = (await sh(provider, id, "grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status")).stdout;
    expect(status).toMatch(/CapPrm:\s+0+\n/);
    expect(status).toMatch(/CapEff:\s+0+\n/);
    if (!options.gvisor) expect(status).toMatch(/NoNewPrivs:\s+1\n/); // gVisor's /proc does not show it
    expect((await sh(provider, id, "id -un")).stdout).toBe("sandbar\n");
    expect((await sh(provider, id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")).stdout).toBe("lo\n");
    // Every process of the sandbox runs as its host uid on the host, none as root.
    if (!options.gvisor) expect((await processesOfUid(hostUid)).length).toBeGreaterThan(1);
    // Another sandbox's processes are not visible.
    await make("iso-other");
    expect((await sh(provider, id, "ps -e -o args= | grep -c '^/opt/sandbar/bin/node '")).stdout).toBe("1\n");
    expect(Number((await sh(provider, id, "ps -e -o pid= | wc -l")).stdout.trim())).toBeLessThan(10);
  });

  it("cannot create nested user namespaces; sees none of the host's environment; writes never reach the base", async () => {
    const { provider, rootfs } = f();
    const id = await make("iso-env", { env: { GREETING: "hello" } });
    // Under gVisor a nested namespace is one of gVisor's kernel, which holds nothing of the host's.
    if (!options.gvisor) expect((await sh(provider, id, "unshare -U true 2>/dev/null && echo nested-ok || echo nested-denied")).stdout).toBe("nested-denied\n");
    const keys = (await sh(provider, id, "env")).stdout.trim().split("\n").map((l) => l.split("=")[0]);
    expect(keys).toContain("GREETING");
    // The engine adds HOSTNAME (the sandbox's id); nothing else beyond the sandbox's own (its CPU quota for nproc included).
    for (const k of keys) expect(["GREETING", "HOME", "OMP_NUM_THREADS", "PATH", "PWD", "USER", "HOSTNAME", "SHLVL", "_"]).toContain(k);
    await sh(provider, id, "echo changed > /srv/shared/gone.txt; echo new > /srv/shared/new.txt");
    expect(await readFile(path.join(rootfs, "srv/shared/gone.txt"), "utf8")).toBe("gone\n");
    await expect(readFile(path.join(rootfs, "srv/shared/new.txt"))).rejects.toThrow();
  });

  it("user root is uid 0 inside, still without capabilities, and cannot write the host's binds", async () => {
    const { provider } = f();
    const id = await make("iso-root", { user: "root" });
    const res = await sh(provider, id, "id -u; grep CapEff /proc/self/status; touch /usr/sandbar-test 2>/dev/null && echo wrote || echo denied; echo hi > ~/mine && cat ~/mine; echo ~");
    expect(res.stdout.trim().split("\n")).toEqual(["0", "CapEff:\t0000000000000000", "denied", "hi", "/root"]);
  });

  it("a process that kills every pid it can see (kill -9 -1): the agent comes back", async () => {
    const { provider } = f();
    const id = await make("killall");
    await sh(provider, id, "echo kept > ~/k").catch(() => undefined);
    await sh(provider, id, "kill -9 -1").catch(() => undefined);
    await restartWindow();
    expect((await retry(() => sh(provider, id, "cat ~/k"), 15_000)).stdout).toBe("kept\n");
    expect((await provider.inspect(id)).state).toBe("started");
  });

  unlessGvisor("enforces the pids and memory limits", async () => {
    const { provider } = f();
    const id = await make("limits", { pidsLimit: 64, memoryGiB: 0.125 });
    // A storm at the limit and an OOM loop can take long on a busy machine: more than a call's usual 30 s.
    const slow = 120_000;
    const forks = await sh(provider, id, "(for i in $(seq 1 100); do sleep 30 & done) 2>/tmp/err; pkill sleep; grep -ci 'fork\\|resource' /tmp/err", slow);
    expect(Number(forks.stdout.trim())).toBeGreaterThan(0);
    if (!options.gvisor) expect((await provider.inspect(id)).usage!.pidsLimitHits).toBeGreaterThan(0);
    const mem = await sh(provider, id, "python3 -c 'a = []\nwhile True: a.append(bytearray(1 << 20))' 2>/dev/null; echo exit=$?", slow);
    expect(mem.stdout).toBe("exit=137\n");
    const info = await provider.inspect(id);
    expect(info.state).toBe("started");
    if (!options.gvisor) expect(info.usage!.oomKills).toBeGreaterThan(0);
  }, 300_000);

  unlessGvisor("resize raises cpu and memory of a running sandbox at once, keeps them across a restart, and refuses bad values", async () => {
    const { provider } = f();
    const id = await make("resize");
    await sh(provider, id, "(sleep 600 >/dev/null 2>&1 &)");
    const resized = await provider.resize(id, { cpu: 1.5, memoryGiB: 1 });
    expect(resized.usage?.memoryLimitBytes).toBe(2 ** 30);
    expect((await sh(provider, id, "ps -e -o comm= | grep -c sleep")).stdout).toBe("1\n");
    await provider.stop(id);
    expect((await provider.start(id)).usage?.memoryLimitBytes).toBe(2 ** 30);
    await expectCode(provider.resize(id, { memoryGiB: -1 }), Code.InvalidArgument);
    await expectCode(provider.resize(uniqueId("absent"), { cpu: 1 }), Code.NotFound);
  });

  it("pack and restore round-trip the writable layer: contents, modes, links, deletions, owners", async () => {
    const { provider, dataDir } = f();
    const src = await make("pack-src");
    const script = [
      "mkdir -p ~/proj/sub && echo hello > ~/proj/sub/a.txt && chmod 600 ~/proj/sub/a.txt",
      "ln -s sub/a.txt ~/proj/link",
      "head -c 3000000 /dev/urandom > ~/proj/blob && sha256sum ~/proj/blob | cut -c1-64 > ~/proj/blob.sum",
      "rm /srv/shared/gone.txt",
    ].join(" && ");
    expect((await sh(provider, src, script)).code).toBe(0);
    await provider.stop(src);
    const archive = path.join(dataDir, `layer-${src}.tar`);
    await pipeline(await provider.pack(src), createWriteStream(archive));
    const dst = await make("pack-dst", {}, false);
    await provider.restore(dst, createReadStream(archive));
    await provider.start(dst);
    // Under gVisor (Debian's runsc 2022-12) stat(1) and ls(1) print nothing in a restored sandbox
    // (not investigated): contents are checked there, owners and the deletion are not.
    const listing = options.gvisor ? "" : "stat -c '%a %U' ~/proj/sub/a.txt; ls /srv/shared; ";
    const res = await sh(provider, dst, `cat ~/proj/sub/a.txt; ${listing}readlink ~/proj/link; sha256sum ~/proj/blob | cut -c1-64 | cmp - ~/proj/blob.sum && echo blob-ok`);
    expect(res.stdout).toBe(`hello\n${options.gvisor ? "" : "600 sandbar\ndir\n"}sub/a.txt\nblob-ok\n`);
    await expectCode(provider.restore(dst, createReadStream(archive)), Code.FailedPrecondition, "stop it");
    await provider.stop(dst);
    await expectCode(provider.restore(dst, Readable.from([Buffer.alloc(10_000, 7)])), Code.FailedPrecondition, "restoring the writable layer failed");
  });

  it("changeLayers: a fresh sandbox's upper holds no user change; then its additions and deletions over the snapshot", async () => {
    const { provider } = f();
    const id = await make("changes");
    const list = async () => {
      const out: string[] = [];
      for await (const p of readChangeset(() => provider.changeLayers!(id), { format: "list" })) if (p.case === "change") out.push(`${p.value.kind} ${p.value.type} ${p.value.path}`);
      return out;
    };
    expect(await list()).toEqual([]);
    expect((await sh(provider, id, "mkdir ~/chg && echo hi > ~/chg/a.txt && rm /srv/shared/gone.txt")).code).toBe(0);
    expect(await list()).toEqual(["added directory /home/sandbar/chg", "added file /home/sandbar/chg/a.txt", "deleted file /srv/shared/gone.txt"]);
    await provider.stop(id);
    expect(await list()).toHaveLength(3);
    await expectCode(provider.changeLayers!(uniqueId("absent")), Code.NotFound);
  });

  it("shares a volume between sandboxes", async () => {
    const { provider, dataDir } = f();
    const root = path.join(dataDir, `vol-${uniqueId("v")}`);
    const a = await make("vol-a", { volumes: [{ root, target: "/data" }] });
    const b = await make("vol-b", { volumes: [{ root, target: "/data", subpath: "sub" }] });
    await sh(provider, a, "mkdir -p /data/sub && echo from-a > /data/sub/f");
    expect((await sh(provider, b, "cat /data/f; echo more >> /data/f && cat /data/f")).stdout).toBe("from-a\nfrom-a\nmore\n");
    expect(await readFile(path.join(root, "sub/f"), "utf8")).toBe("from-a\nmore\n");
  });

  it("a new provider on the same data dir finds its sandboxes and operates them", async () => {
    const id = await make("adopt");
    const stopped = await make("adopt-stopped");
    await f().provider.stop(stopped);
    const again = await f().reopen();
    const listed = new Map((await again.list()).map((i) => [i.id, i.state]));
    expect(listed.get(id)).toBe("started");
    expect(listed.get(stopped)).toBe("stopped");
    expect((await sh(again, id, "echo adopted")).stdout).toBe("adopted\n");
    const { hostUid } = await again.inspect(id);
    expect((await again.stop(id)).state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
  });

  it("pause freezes the sandbox and resume lets its processes go on; idempotent; kept paused by a new provider; stop ends it", async () => {
    const { provider } = f();
    const id = await make("pause");
    // A loop counting in the home dir, its pid kept: after the resume the same loop counts on.
    await sh(provider, id, "(n=0; while true; do n=$((n+1)); echo $n > ~/count; sleep 0.05; done) >/dev/null 2>&1 & echo $! > ~/loop.pid");
    const count = async () => Number((await sh(provider, id, "cat ~/count")).stdout.trim());
    await retry(async () => expect(await count()).toBeGreaterThan(2));
    const paused = await provider.pause(id);
    expect(paused.state).toBe("paused");
    expect(paused.paused?.residentBytes).toBeGreaterThan(0);
    expect((await provider.pause(id)).state).toBe("paused");
    const again = await f().reopen();
    expect((await again.list()).find((i) => i.id === id)?.state).toBe("paused");
    expect((await again.resume(id)).state).toBe("started");
    expect((await provider.resume(id)).state).toBe("started");
    const before = await count();
    await retry(async () => expect(await count()).toBeGreaterThan(before));
    expect((await sh(provider, id, 'kill -0 "$(cat ~/loop.pid)" && echo same-loop')).stdout).toBe("same-loop\n");
    await provider.pause(id);
    const { hostUid } = await provider.inspect(id);
    expect((await provider.stop(id)).state).toBe("stopped");
    expect(await processesOfUid(hostUid)).toEqual([]);
    await expectCode(provider.pause(id), Code.FailedPrecondition);
  });

  it("destroy leaves no process behind and is idempotent", async () => {
    const { provider } = f();
    const id = await make("destroy");
    await sh(provider, id, "sleep 600 >/dev/null 2>&1 & echo x > ~/f");
    const { hostUid } = await provider.inspect(id);
    await provider.destroy(id);
    created.delete(id);
    expect(await processesOfUid(hostUid)).toEqual([]);
    await expectCode(provider.inspect(id), Code.NotFound);
    await provider.destroy(id);
    await provider.destroy(uniqueId("never"));
  });

  it("rejects bad specs and unknown sandboxes with clear errors", async () => {
    const { provider } = f();
    await expectCode(provider.create(f().spec("bad id")), Code.InvalidArgument, "sandbox id");
    await expectCode(provider.create(f().spec(uniqueId("x"), { cpu: 0 })), Code.InvalidArgument, "cpu");
    await expectCode(provider.create(f().spec(uniqueId("x"), { rootfs: "/nonexistent/rootfs" })), Code.FailedPrecondition, "does not exist");
    const id = await make("dup", {}, false);
    await expectCode(provider.create(f().spec(id)), Code.AlreadyExists);
    await expectCode(provider.inspect("unknown-sandbox"), Code.NotFound);
    await expectCode(provider.start("unknown-sandbox"), Code.NotFound);
    await expectCode(provider.pack("unknown-sandbox"), Code.NotFound);
  });
}

/** Files the contract's cases expect in the rootfs (/srv/shared). */
export async function prepareContractRootfs(rootfs: string): Promise<void> {
  await mkdir(path.join(rootfs, "srv/shared/dir"), { recursive: true });
  await writeFile(path.join(rootfs, "srv/shared/gone.txt"), "gone\n", { mode: 0o666 });
  await chmod(path.join(rootfs, "srv/shared"), 0o777);
}
