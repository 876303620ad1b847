import { createHmac } from "node:crypto";
import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import { Code, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { SandboxService } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SandboxRecord } from "../db/entities.ts";
import { sh } from "./testing/agent-client.ts";
import { eventually, sandboxFixture, type SandboxFixture } from "./testing/fixtures.ts";
import { leftovers } from "./testing/leaks.ts";
import type { UntypedJson } from "../casts.ts";

// The sandbox lifecycle over REST against a real server whose sandboxes are real (overlayfs,
// namespaces, cgroups), run by the stand-in agent.

let f: SandboxFixture;
beforeAll(async () => {
  f = await sandboxFixture();
});
afterAll(() => f?.stop());

const notFound = (x: string) => `Sandbox with ID or name ${x} not found`;

async function expectError(res: { status: number; body: UntypedJson }, status: number, message: string | RegExp) {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  if (typeof message === "string") expect(res.body.message).toBe(message);
  else expect(res.body.message).toMatch(message);
}

describe("create", () => {
  it("starts a sandbox from the default snapshot and answers it started, with the reference's DTO", async () => {
    const s = await f.create({ env: { GREETING: "hello there" }, labels: { team: "a" } });
    expect(s).toMatchObject({
      organizationId: f.orgId,
      name: s.id,
      snapshot: "sandbar-default",
      user: "sandbar",
      env: { GREETING: "hello there" },
      labels: { team: "a" },
      public: false,
      target: "local",
      cpu: 1,
      gpu: 0,
      memory: 1,
      disk: 3,
      state: "started",
      desiredState: "started",
      errorReason: null,
      backupState: "None",
      backupCreatedAt: null,
      autoStopInterval: 15,
      autoArchiveInterval: 10080,
      autoDeleteInterval: -1,
      volumes: [],
      sandboxClass: "container",
      runnerId: f.runtime.runnerId,
      toolboxProxyUrl: `${f.t.url}/api/toolbox-proxy`,
    });
    expect(s.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(Date.parse(s.lastActivityAt)).not.toBeNaN();
    // The sandbox really runs, as its user, with its environment.
    const out = await f.exec(s.id, 'id -un; echo "$GREETING"; cat /etc/os-release | grep ^ID=');
    expect(out).toEqual({ exitCode: 0, result: "sandbar\nhello there\nID=debian\n" });
  });

  it("gives the sandbox the resources asked for, within the per-sandbox limits", async () => {
    const s = await f.create({ cpu: 2, memory: 2, disk: 4, user: "dev", name: "sized" });
    expect(s).toMatchObject({ cpu: 2, memory: 2, disk: 4, user: "dev", name: "sized" });
    const info = await f.runtime.provider.inspect(s.id);
    expect(info.spec).toMatchObject({ cpu: 2, memoryGiB: 2, diskGiB: 4, user: "dev" });
    expect((await f.exec(s.id, "id -un")).result).toBe("dev\n");
  });

  it.each([
    // The organization's per-sandbox maxima (the defaults), then a hint on raising them.
    [{ cpu: 5 }, /^CPU request 5 exceeds maximum allowed per sandbox \(4\)\.\n/],
    [{ memory: 9 }, /^Memory request 9GB exceeds maximum allowed per sandbox \(8GB\)\.\n/],
    [{ disk: 11 }, /^Disk request 11GB exceeds maximum allowed per sandbox \(10GB\)\.\n/],
    [{ gpu: 1 }, "GPU sandboxes must be ephemeral - set autoDeleteInterval to 0"],
    [{ gpu: 2, cpu: -1 }, "cpu must not be less than 0, gpu must not be greater than 1"],
    [{ snapshot: "ubuntu:22.04" }, "Snapshot ubuntu:22.04 not found. Did you add it through the Daytona Dashboard?"],
    [{ autoStopInterval: -1 }, "Auto-stop interval must be non-negative"],
    [{ autoArchiveInterval: -1 }, "Auto-archive interval must be non-negative"],
    [{ name: "<b>x</b>" }, "name must not contain HTML tags, URLs, or control characters"],
    [{ user: "Root!" }, "user must be 1-32 lower-case letters, digits, '_' or '-', starting with a letter or '_'"],
    [{ env: { "1X": "y" } }, `env name "1X" is invalid: use letters, digits and '_', not starting with a digit`],
    [{ gpuType: ["H100"] }, "gpuType is only allowed with gpu: 1 (it chooses the model of the sandbox's GPU)"],
    [{ snapshot: "some-image-snapshot", gpuType: ["H100"] }, "Cannot specify GPU type when creating sandbox from snapshot. GPU type is inherited from snapshot."],
    [{ class: "mainframe" }, "class must be one of the following values: container, linux-vm, android, windows"],
    [{ buildInfo: { dockerfileContent: "FROM x" }, snapshot: "s" }, "Cannot specify a snapshot when using a build info entry"],
    [{ buildInfo: { dockerfileContent: "" } }, "buildInfo.dockerfileContent should not be empty"],
    [{ buildInfo: { dockerfileContent: "FROM x", contextHashes: ["a/b"] } }, `buildInfo.contextHashes: each value must be a context hash (letters, digits, '-' or '_'), got "a/b"`],
    [{ cpu: "two" }, "cpu must be a number"],
    // A named snapshot brings its resources, as the reference's (any of the four, the default snapshot too).
    [{ snapshot: "sandbar-default", cpu: 2 }, "Cannot specify Sandbox resources when using a snapshot"],
    [{ snapshot: "sandbar-default", memory: 2 }, "Cannot specify Sandbox resources when using a snapshot"],
    [{ snapshot: "some-image-snapshot", disk: 4 }, "Cannot specify Sandbox resources when using a snapshot"],
    [{ snapshot: "sandbar-default", gpu: 1 }, "Cannot specify Sandbox resources when using a snapshot"],
    [{ snapshot: "sandbar-default", cpu: 2, gpuType: ["H100"] }, "Cannot specify Sandbox resources when using a snapshot"],
  ])("refuses %j with 400", async (body, message) => {
    await expectError(await f.call("POST", "/sandbox", body), 400, message);
  });

  it("takes zero resources with a named snapshot as none given (the reference checks truthiness)", async () => {
    const s = await f.create({ snapshot: "sandbar-default", cpu: 0, memory: 0, disk: 0, gpu: 0 });
    expect(s).toMatchObject({ snapshot: "sandbar-default", cpu: 1, memory: 1, disk: 3 });
  });

  it("stores auto-archive 0 and oversized values as the maximum", async () => {
    expect((await f.create({ autoArchiveInterval: 0 })).autoArchiveInterval).toBe(43200);
    expect((await f.create({ autoArchiveInterval: 99999, snapshot: "sandbar-default" })).autoArchiveInterval).toBe(43200);
  });

  it("keeps names unique per organization: 409 for a taken name", async () => {
    await f.create({ name: "twin" });
    await expectError(await f.call("POST", "/sandbox", { name: "twin" }), 409, "Sandbox with name twin already exists");
    const byName = await f.call("GET", "/sandbox/twin");
    expect(byName.status).toBe(200);
    expect(byName.body.name).toBe("twin");
  });

  it("answers 400 with the reason when the sandbox fails to start, and leaves it in error", async () => {
    const res = await f.call("POST", "/sandbox", { name: "broken", env: { STAND_IN_EXIT_CODE: "3" } });
    await expectError(res, 400, /^Sandbox failed to start: .*exited with 3.*exiting with 3 as asked/s);
    const got = (await f.call("GET", "/sandbox/broken")).body;
    expect(got.state).toBe("error");
    expect(got.errorReason).toMatch(/exited with 3/);
    await expectError(await f.call("POST", "/sandbox/broken/start"), 400, "Sandbox is in an errored state");
    await expectError(await f.call("POST", "/sandbox/broken/stop"), 400, "Sandbox is in an errored state");
    await expectError(await f.call("POST", "/sandbox/broken/archive"), 400, "Sandbox is in an errored state");
    await expect(f.manager.agentFor(f.orgId, "broken")).rejects.toMatchObject({ code: Code.InvalidArgument, rawMessage: "Sandbox is not running" });
    const { hostUid } = await f.runtime.provider.inspect(got.id);
    const del = await f.call("DELETE", "/sandbox/broken");
    expect(del.status).toBe(200);
    expect(del.body.state).toBe("destroyed");
    expect(await leftovers(f.runtime, got.id, hostUid)).toEqual([]);
  });

  it("needs write:sandboxes", async () => {
    const key = await f.call("POST", "/api-keys", { name: "reader", permissions: [] });
    await expectError(await f.call("POST", "/sandbox", {}, key.body.value), 403, "Access denied");
  });
});

describe("health", () => {
  it("reports on a read what its workload did: OOM kills, memory and processes, agent restarts", async () => {
    const s = await f.create({ memory: 1 });
    const before = await f.call("GET", `/sandbox/${s.id}`);
    expect(before.body.health).toMatchObject({ agentRunning: true, agentRestarts: 0, oomKills: 0, pidsLimitHits: 0, memoryLimitBytes: 1 << 30 });
    // Allocates and touches twice its memory: the OOM killer ends it, not the sandbox.
    const hog = await f.exec(s.id, `python3 -c 'b = bytearray(2 << 30)'`);
    expect(hog.exitCode).not.toBe(0);
    const after = await f.call("GET", `/sandbox/${s.id}`);
    expect(after.body.state).toBe("started");
    expect(after.body.health.oomKills).toBeGreaterThan(0);
    expect(after.body.health.pids).toBeGreaterThan(0);
    // Lists stay cheap: no live counters there.
    const list = await f.call("GET", "/sandbox");
    expect(list.body.find((x: { id: string }) => x.id === s.id).health).toBeNull();
  });
});

describe("stop and start", () => {
  it("keeps files across stop and start, leaves no process while stopped, and rotates the preview token", async () => {
    const s = await f.create();
    const token1 = (await f.call("GET", `/sandbox/${s.id}/ports/8080/preview-url`)).body.token;
    expect((await f.exec(s.id, "echo kept > ~/notes.txt && sleep 600 >/dev/null 2>&1 &")).exitCode).toBe(0);
    const { hostUid } = await f.runtime.provider.inspect(s.id);

    const stopped = await f.call("POST", `/sandbox/${s.id}/stop`);
    expect(stopped.status).toBe(200);
    expect(stopped.body).toMatchObject({ state: "stopped", desiredState: "stopped" });
    expect(await f.runtime.provider.cgroups.pids(s.id)).toEqual([]);
    expect((await leftovers(f.runtime, s.id, hostUid)).filter((l) => l.startsWith("process") || l.startsWith("mount"))).toEqual([]);
    await expectError(await f.call("POST", `/sandbox/${s.id}/stop`), 400, "Sandbox is not in a stoppable state");
    await expect(f.manager.agentFor(f.orgId, s.id)).rejects.toMatchObject({ code: Code.InvalidArgument, rawMessage: "Sandbox is not running" });

    const started = await f.call("POST", `/sandbox/${s.id}/start`);
    expect(started.status).toBe(200);
    expect(started.body).toMatchObject({ id: s.id, state: "started", desiredState: "started" });
    expect((await f.exec(s.id, "cat ~/notes.txt")).result).toBe("kept\n");
    const token2 = (await f.call("GET", `/sandbox/${s.id}/ports/8080/preview-url`)).body.token;
    expect(token2).toMatch(/^[a-z0-9]{32}$/);
    expect(token2).not.toBe(token1);

    // Starting a started sandbox changes nothing.
    const again = await f.call("POST", `/sandbox/${s.id}/start`);
    expect(again.status).toBe(200);
    expect(again.body.state).toBe("started");
    expect((await f.call("GET", `/sandbox/${s.id}/ports/8080/preview-url`)).body.token).toBe(token2);
  });

  it("runs one operation at a time: 409 while a stop is in progress, then a forced stop is immediate", async () => {
    const s = await f.create({ env: { STAND_IN_IGNORE_SIGTERM: "1" } });
    const t0 = Date.now();
    const slow = f.call("POST", `/sandbox/${s.id}/stop`);
    await eventually("the stop to begin", async () => (await f.call("GET", `/sandbox/${s.id}`)).body.state === "stopping");
    await expectError(await f.call("POST", `/sandbox/${s.id}/start`), 409, "Sandbox state change in progress");
    await expectError(await f.call("POST", `/sandbox/${s.id}/stop`), 409, "Sandbox state change in progress");
    await expectError(await f.call("POST", `/sandbox/${s.id}/archive`), 409, "Sandbox state change in progress");
    await expectError(await f.call("DELETE", `/sandbox/${s.id}`), 409, "Sandbox state change in progress");
    await expectError(await f.call("POST", `/sandbox/${s.id}/backup`), 409, "Sandbox state change in progress");
    await expect(f.manager.agentFor(f.orgId, s.id)).rejects.toMatchObject({ rawMessage: "Sandbox state change in progress" });
    expect((await slow).body.state).toBe("stopped");
    expect(Date.now() - t0).toBeGreaterThan(4900); // it waited out the 5 s grace period

    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await f.exec(s.id, "cat ~/stand-in-signals")).result).toBe("TERM\n"); // the graceful stop's
    const forced = await f.call("POST", `/sandbox/${s.id}/stop?force=true`);
    expect(forced.body.state).toBe("stopped");
    // Immediate: the forced stop sent no SIGTERM to wait on (it killed at once).
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await f.exec(s.id, "cat ~/stand-in-signals")).result).toBe("TERM\n");
  });

  it("destroys an ephemeral sandbox (autoDeleteInterval 0) when it stops", async () => {
    const s = await f.create({ autoDeleteInterval: 0 });
    await expectError(await f.call("POST", `/sandbox/${s.id}/backup`), 400, "Ephemeral sandboxes cannot be backed up");
    const { hostUid } = await f.runtime.provider.inspect(s.id);
    const res = await f.call("POST", `/sandbox/${s.id}/stop`);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ state: "destroyed", desiredState: "destroyed" });
    expect(res.body.name).toMatch(new RegExp(`^DESTROYED_${s.id}_\\d+$`));
    expect((await f.call("GET", `/sandbox/${s.id}`)).body.state).toBe("destroyed"); // read by id during the grace period
    expect(await leftovers(f.runtime, s.id, hostUid)).toEqual([]);
  });
});

describe("archive", () => {
  it("packs a stopped sandbox to disk, frees the host, and restores it on start with its files", async () => {
    const s = await f.create({ name: "to-archive" });
    await f.exec(s.id, "mkdir -p ~/work && echo precious > ~/work/data && ln -s data ~/work/link");
    await expectError(await f.call("POST", "/sandbox/to-archive/archive"), 400, "Sandbox is not stopped");
    await f.call("POST", "/sandbox/to-archive/stop");
    const { hostUid } = await f.runtime.provider.inspect(s.id);

    const archived = await f.call("POST", "/sandbox/to-archive/archive");
    expect(archived.status).toBe(200);
    expect(archived.body).toMatchObject({ state: "archived", desiredState: "archived", runnerId: null });
    const tar = path.join(f.t.dataDir, "archives", `${s.id}.tar`);
    expect((await stat(tar)).mode & 0o777).toBe(0o600);
    expect(await f.runtime.inspect(s.id)).toBeUndefined();
    expect(await leftovers(f.runtime, s.id, hostUid)).toEqual([]);
    await expectError(await f.call("POST", "/sandbox/to-archive/archive"), 400, "Sandbox is not stopped");
    await expectError(await f.call("POST", "/sandbox/to-archive/stop"), 400, "Sandbox is not in a stoppable state");
    expect((await f.call("GET", "/sandbox?states=archived")).body.map((x: { id: string }) => x.id)).toContain(s.id);

    const started = await f.call("POST", "/sandbox/to-archive/start");
    expect(started.status).toBe(200);
    expect(started.body).toMatchObject({ state: "started", runnerId: f.runtime.runnerId });
    expect((await f.exec(s.id, "cat ~/work/link; stat -c %U ~/work/data")).result).toBe("precious\nsandbar\n");
    await expect(stat(tar)).rejects.toThrow();
  });

  it("refuses to archive an ephemeral sandbox", async () => {
    // An ephemeral sandbox is destroyed when it stops: it can only be seen stopped if made ephemeral later.
    const s = await f.create();
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await f.call("POST", `/sandbox/${s.id}/autodelete/0`);
    await expectError(await f.call("POST", `/sandbox/${s.id}/archive`), 400, "Ephemeral sandboxes cannot be archived");
  });
});

describe("backup", () => {
  it("writes a point-in-time pack and restores from it when the host lost the sandbox", async () => {
    const s = await f.create();
    await f.exec(s.id, "echo before > ~/a");
    const res = await f.call("POST", `/sandbox/${s.id}/backup`);
    expect(res.status).toBe(200);
    expect(["InProgress", "Completed"]).toContain(res.body.backupState);
    await eventually("the backup", async () => (await f.call("GET", `/sandbox/${s.id}`)).body.backupState === "Completed");
    const done = (await f.call("GET", `/sandbox/${s.id}`)).body;
    expect(Date.parse(done.backupCreatedAt)).toBeGreaterThan(Date.parse(s.createdAt) - 1);
    expect((await stat(path.join(f.t.dataDir, "backups", `${s.id}.tar`))).size).toBeGreaterThan(0);

    await f.exec(s.id, "echo after > ~/b");
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await f.runtime.destroy(s.id); // the host loses the sandbox's files
    const started = await f.call("POST", `/sandbox/${s.id}/start`);
    expect(started.body.state).toBe("started");
    expect((await f.exec(s.id, "cat ~/a; test -e ~/b || echo no-b")).result).toBe("before\nno-b\n");
  });

  it("a sandbox whose first process died is in error with what happened, and start (or stop) recovers it with its files", async () => {
    // The sandbox's pid 1 (its agent's supervisor) killed from the host: nothing is left to run it.
    const killInit = async (id: string) => {
      const p = f.runtime.provider;
      for (const pid of await p.cgroups.agentPids(id)) {
        // A process may end between the listing and the read: it is not the init then.
        const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
        const ns = /^NSpid:\s+(.*)$/m.exec(status)?.[1].trim().split(/\s+/) ?? [];
        if (ns.length > 1 && ns[ns.length - 1] === "1") process.kill(pid, "SIGKILL");
      }
      await eventually("the sandbox's first process is gone", async () => (await p.inspect(id)).state === "error");
    };
    const s = await f.create();
    await f.exec(s.id, "echo kept > ~/kept");
    await killInit(s.id);
    // A start before the timers noticed recovers it at once.
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await f.exec(s.id, "cat ~/kept")).result).toBe("kept\n");

    await killInit(s.id);
    await f.manager.markLost(s.id, "the sandbox is gone from its host"); // what the timers do
    const lost = (await f.call("GET", `/sandbox/${s.id}`)).body;
    expect(lost.state).toBe("error");
    expect(lost.errorReason).toMatch(/first process (was killed|exited).*start it again to recover it/);
    const again = await f.call("POST", `/sandbox/${s.id}/start`);
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    expect(again.body).toMatchObject({ state: "started", errorReason: null });
    expect((await f.exec(s.id, "cat ~/kept")).result).toBe("kept\n");

    await killInit(s.id);
    await f.manager.markLost(s.id, "the sandbox is gone from its host");
    const stopped = await f.call("POST", `/sandbox/${s.id}/stop`);
    expect(stopped.status, JSON.stringify(stopped.body)).toBe(200);
    await eventually("stopped", async () => (await f.call("GET", `/sandbox/${s.id}`)).body.state === "stopped");
    expect((await f.call("POST", `/sandbox/${s.id}/start`)).body.state).toBe("started");
    expect((await f.exec(s.id, "cat ~/kept")).result).toBe("kept\n");
  });

  it("without a backup, a sandbox the host lost goes to error with the reason", async () => {
    const s = await f.create();
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await f.runtime.destroy(s.id);
    await expectError(await f.call("POST", `/sandbox/${s.id}/start`), 400, /^Sandbox failed to start: Sandbox has no runner and backup is not completed/);
    expect((await f.call("GET", `/sandbox/${s.id}`)).body.state).toBe("error");
  });
});

describe("attributes", () => {
  it("replaces labels, filters the list by labels, and refuses bad label JSON", async () => {
    const s = await f.create({ labels: { keep: "no" } });
    const res = await f.call("PUT", `/sandbox/${s.id}/labels`, { labels: { env: "dev", owner: "x" } });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id: s.id, labels: { env: "dev", owner: "x" } });
    const hits = await f.call("GET", `/sandbox?labels=${encodeURIComponent(JSON.stringify({ env: "dev" }))}`);
    expect(hits.status).toBe(200);
    expect(hits.body.map((x: { id: string }) => x.id)).toEqual([s.id]);
    expect((await f.call("GET", `/sandbox?labels=${encodeURIComponent('{"env":"prod"}')}`)).body).toEqual([]);
    await expectError(await f.call("GET", "/sandbox?labels=notjson"), 400, "Invalid labels JSON format");
    const page = await f.call("GET", `/sandbox/paginated?labels=${encodeURIComponent('{"owner":"x"}')}&limit=1`);
    expect(page.body).toMatchObject({ total: 1, page: 1, totalPages: 1 });
  });

  it("sets the public flag (201) and the intervals, with the reference's rules", async () => {
    const s = await f.create();
    const pub = await f.call("POST", `/sandbox/${s.id}/public/true`);
    expect(pub.status).toBe(201);
    expect(pub.body.public).toBe(true);
    expect((await f.call("POST", `/sandbox/${s.id}/public/false`)).body.public).toBe(false);
    expect((await f.call("POST", `/sandbox/${s.id}/autostop/30`)).body.autoStopInterval).toBe(30);
    await expectError(await f.call("POST", `/sandbox/${s.id}/autostop/-1`), 400, "Auto-stop interval must be non-negative");
    expect((await f.call("POST", `/sandbox/${s.id}/autoarchive/0`)).body.autoArchiveInterval).toBe(43200);
    expect((await f.call("POST", `/sandbox/${s.id}/autoarchive/50000`)).body.autoArchiveInterval).toBe(43200);
    expect((await f.call("POST", `/sandbox/${s.id}/autoarchive/60`)).body.autoArchiveInterval).toBe(60);
    await expectError(await f.call("POST", `/sandbox/${s.id}/autoarchive/-5`), 400, "Auto-archive interval must be non-negative");
    expect((await f.call("POST", `/sandbox/${s.id}/autodelete/-1`)).body.autoDeleteInterval).toBe(-1);
    expect((await f.call("POST", `/sandbox/${s.id}/autodelete/120`)).body.autoDeleteInterval).toBe(120);
  });

  it("hands out preview URLs, the toolbox proxy URL, and answers build logs 404", async () => {
    const s = await f.create();
    const res = await f.call("GET", `/sandbox/${s.id}/ports/3000/preview-url`);
    expect(res.status).toBe(200);
    const row = await f.t.server.orm.em.fork().findOneOrFail(SandboxRecord, { id: s.id });
    // No SANDBAR_PREVIEW_DOMAIN here: the path form, which needs no wildcard DNS (preview/urls.ts).
    expect(res.body).toEqual({ sandboxId: s.id, url: `${f.t.url}/api/preview-proxy/${s.id}/3000`, token: row.authToken });
    await expectError(await f.call("GET", `/sandbox/${s.id}/ports/0/preview-url`), 400, "Invalid port");
    await expectError(await f.call("GET", `/sandbox/${s.id}/ports/65536/preview-url`), 400, "Invalid port");
    expect((await f.call("GET", `/sandbox/${s.id}/toolbox-proxy-url`)).body).toEqual({ url: `${f.t.url}/api/toolbox-proxy` });
    await expectError(await f.call("GET", `/sandbox/${s.id}/build-logs`), 404, `Sandbox with ID or name ${s.id} has no build info`);
  });

  it("lets toolbox preview clients in with the preview token only, public sandbox or not (port 2280 always needs it)", async () => {
    const s = await f.create();
    const { token } = (await f.call("GET", `/sandbox/${s.id}/ports/2280/preview-url`)).body;
    expect((await f.manager.previewToken(s.id, token)).sandboxId).toBe(s.id);
    await expect(f.manager.previewToken(s.id, "wrong")).rejects.toMatchObject({ code: Code.Unauthenticated });
    await expect(f.manager.previewToken("6f1d2c3b-0000-4000-8000-00000000dead", token)).rejects.toMatchObject({ code: Code.NotFound });
    await expect(f.manager.previewToken("not-an-id", token)).rejects.toMatchObject({ code: Code.NotFound });
    await f.call("POST", `/sandbox/${s.id}/public/true`);
    await expect(f.manager.previewToken(s.id, "")).rejects.toMatchObject({ code: Code.Unauthenticated });
    expect((await f.manager.previewToken(s.id, token)).sandboxId).toBe(s.id);
    // A restart rotates the token: the old one stops working.
    await f.call("POST", `/sandbox/${s.id}/public/false`);
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await f.call("POST", `/sandbox/${s.id}/start`);
    await expect(f.manager.previewToken(s.id, token)).rejects.toMatchObject({ code: Code.Unauthenticated });
  });
});

describe("lists", () => {
  it("pages by number and by cursor (over Connect), and filters by reported state", async () => {
    const names = ["list-a", "list-b", "list-c"];
    for (const name of names) await f.create({ name, labels: { group: "lists" } });
    await f.call("POST", "/sandbox/list-b/stop");
    const labels = encodeURIComponent('{"group":"lists"}');
    const p1 = await f.call("GET", `/sandbox/paginated?labels=${labels}&limit=2&page=1&sort=name&order=asc`);
    expect(p1.body).toMatchObject({ total: 3, page: 1, totalPages: 2 });
    expect(p1.body.items.map((x: { name: string }) => x.name)).toEqual(["list-a", "list-b"]);
    const p2 = await f.call("GET", `/sandbox/paginated?labels=${labels}&limit=2&page=2&sort=name&order=asc`);
    expect(p2.body.items.map((x: { name: string }) => x.name)).toEqual(["list-c"]);
    await expectError(await f.call("GET", "/sandbox/paginated?limit=201"), 400, "limit must not be greater than 200");
    await expectError(await f.call("GET", "/sandbox/paginated?page=0"), 400, "page must not be less than 1");
    const stopped = await f.call("GET", `/sandbox?labels=${labels}&states=stopped`);
    expect(stopped.body.map((x: { name: string }) => x.name)).toEqual(["list-b"]);
    await expectError(await f.call("GET", "/sandbox?states=destroyed"), 400, /^each value in states must be one of the following values: creating, restoring, destroying, started/);

    const auth: Interceptor = (next) => (req) => {
      req.header.set("authorization", `Bearer ${f.t.adminKey}`);
      return next(req);
    };
    const client = createClient(SandboxService, createConnectTransport({ baseUrl: f.t.url, httpVersion: "1.1", interceptors: [auth] }));
    const seen: string[] = [];
    let cursor: string | undefined;
    for (let i = 0; i < 5; i++) {
      const page = await client.listSandboxes({ labels: '{"group":"lists"}', limit: 1, cursor, sort: 1 /* name */, order: 1 /* asc */ });
      seen.push(...page.items.map((x) => x.name));
      cursor = page.nextCursor;
      if (!cursor) break;
    }
    expect(seen).toEqual(names);
    await expect(client.listSandboxes({ cursor: "garbage" })).rejects.toMatchObject({ code: Code.InvalidArgument, rawMessage: "Invalid cursor provided: garbage" });
  });
});

describe("organizations", () => {
  it("answers 404 for another organization's sandbox, whatever the operation", async () => {
    const mine = await f.create({ name: "private" });
    const other = await f.otherOrganization();
    for (const [method, p, body] of [
      ["GET", `/sandbox/${mine.id}`],
      ["GET", "/sandbox/private"],
      ["POST", `/sandbox/${mine.id}/start`],
      ["POST", `/sandbox/${mine.id}/stop`],
      ["POST", `/sandbox/${mine.id}/archive`],
      ["POST", `/sandbox/${mine.id}/backup`],
      ["PUT", `/sandbox/${mine.id}/labels`, { labels: {} }],
      ["POST", `/sandbox/${mine.id}/autostop/5`],
      ["GET", `/sandbox/${mine.id}/ports/80/preview-url`],
      ["DELETE", `/sandbox/${mine.id}`],
    ] as const) {
      const res = await f.call(method, p, body, other.key);
      const x = p.split("/")[2];
      await expectError(res, 404, notFound(x));
    }
    expect((await f.call("GET", "/sandbox", undefined, other.key)).body).toEqual([]);
    await expect(f.manager.agentFor(other.orgId, mine.id)).rejects.toMatchObject({ code: Code.NotFound });
    // Names are per organization.
    const theirs = await f.call("POST", "/sandbox", { name: "private" }, other.key);
    expect(theirs.status).toBe(200);
    expect(theirs.body.organizationId).toBe(other.orgId);
    expect((await f.call("GET", "/sandbox/private")).body.id).toBe(mine.id);
    expect((await f.call("DELETE", "/sandbox/private", undefined, other.key)).status).toBe(200);
  });
});

describe("delete", () => {
  it("destroys the sandbox: no mount, cgroup, process or directory is left, and the name is free", async () => {
    const s = await f.create({ name: "doomed" });
    await f.exec(s.id, "sleep 600 >/dev/null 2>&1 & echo x > ~/f");
    const { hostUid } = await f.runtime.provider.inspect(s.id);
    expect((await leftovers(f.runtime, s.id, hostUid)).length).toBeGreaterThan(2);
    const res = await f.call("DELETE", "/sandbox/doomed");
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id: s.id, state: "destroyed", desiredState: "destroyed", runnerId: null, backupState: "None" });
    expect(res.body.name).toMatch(/^DESTROYED_doomed_\d+$/);
    expect(await leftovers(f.runtime, s.id, hostUid)).toEqual([]);
    await expectError(await f.call("GET", "/sandbox/doomed"), 404, notFound("doomed"));
    await expectError(await f.call("DELETE", `/sandbox/${s.id}`), 404, notFound(s.id));
    expect((await f.call("GET", "/sandbox")).body.map((x: { id: string }) => x.id)).not.toContain(s.id);
    expect((await f.create({ name: "doomed" })).name).toBe("doomed");
  });

  it("deletes archived sandboxes and their archive", async () => {
    const s = await f.create();
    await f.call("POST", `/sandbox/${s.id}/stop`);
    await f.call("POST", `/sandbox/${s.id}/archive`);
    const tar = path.join(f.t.dataDir, "archives", `${s.id}.tar`);
    await stat(tar);
    expect((await f.call("DELETE", `/sandbox/${s.id}`)).body.state).toBe("destroyed");
    await expect(stat(tar)).rejects.toThrow();
  });
});

describe("agent secrets", () => {
  it("derives each agent's secret from a 0600 host secret; agents refuse other secrets; nothing is stored per sandbox", async () => {
    const s = await f.create();
    const file = path.join(f.t.dataDir, "runner", "host-secret");
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const host = Buffer.from((await readFile(file, "utf8")).trim(), "hex");
    const expected = createHmac("sha256", host).update(s.id).digest("hex");
    const agent = await f.manager.agentFor(f.orgId, s.id);
    expect(agent).toMatchObject({ sandboxId: s.id, key: await f.runtime.agentSocket(s.id), secret: expected });
    await expect(sh({ socket: agent.key, secret: "wrong" }, "true")).rejects.toMatchObject({ code: Code.Unauthenticated });
    expect(await sh(agent, "echo ok")).toEqual({ exitCode: 0, result: "ok\n" });
    const row = await f.t.server.orm.em.fork().findOneOrFail(SandboxRecord, { id: s.id });
    expect(JSON.stringify(row)).not.toContain(expected);
  });
});
