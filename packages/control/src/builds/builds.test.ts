import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRegistry, type TestRegistry } from "../../../runner/src/images/testing/registry.ts";
import type { CreateBuildInfo } from "@sandbar/protocol/gen/sandbar/control/v1/sandbox_pb.js";
import { pushTestImage, registryAccount } from "../snapshots/testing/image.ts";
import { checkBuildInfo } from "./build-info.ts";
import { Builder } from "./builder.ts";
import { tarOf, uploadContext, uploadSleepContext } from "./testing/contexts.ts";
import { api, startTestServer, type TestServer } from "../testing/server.ts";

// Declarative builds across a restart of a real server (same data dir and database): a snapshot
// whose build was cut short builds again and ends active; a sandbox whose build was cut short ends
// build_failed saying why. The context (the host's `sleep`, so a RUN step lasts) is uploaded
// through push-access with the AWS S3 client. Run as root.

describe("declarative builds on a real server", () => {
  let reg: TestRegistry;
  let scratch: string;
  let dataDir: string;
  let base: string;
  let t: TestServer;
  const adminKey = "sbr_" + "b".repeat(64);
  const call = (verb: string, p: string, body?: unknown) => api(t.url, adminKey, verb, p, body);
  const until = async <T>(what: string, fn: () => Promise<T | undefined>, ms = 120_000): Promise<T> => {
    const end = Date.now() + ms;
    for (;;) {
      const v = await fn();
      if (v !== undefined) return v;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  const dockerfile = (seconds: number) => `FROM ${base}\nCOPY /bin/sleep /bin/sleep\nRUN echo start && sleep ${seconds} && echo slept > /slept.txt\n`;

  beforeAll(async () => {
    scratch = await mkdtemp(path.join(tmpdir(), "sandbar-builds-"));
    dataDir = await mkdtemp(path.join(tmpdir(), "sandbar-builds-restart-")); // directly under /tmp: PostgreSQL's user must reach it
    reg = await startRegistry();
    base = await pushTestImage(reg, scratch, "builds/base:1.0");
    t = await startTestServer({ dataDir, adminKey });
    expect((await call("POST", "/docker-registry", { name: "r", url: `http://${reg.host}`, username: reg.username, password: reg.password })).status).toBe(201);
    await uploadSleepContext(call, scratch);
  }, 300_000);

  afterAll(async () => {
    await t?.stop();
    await reg?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true });
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  it("a snapshot's build cut by a restart builds again and ends active; a sandbox's ends build_failed", async () => {
    const snap = await call("POST", "/snapshots", { name: "slow-build", buildInfo: { dockerfileContent: dockerfile(10), contextHashes: ["sleepctx"] } });
    expect(snap.status, JSON.stringify(snap.body)).toBe(200);
    const sbx = await call("POST", "/sandbox", { buildInfo: { dockerfileContent: dockerfile(60), contextHashes: ["sleepctx"] } });
    expect(sbx.status, JSON.stringify(sbx.body)).toBe(200);
    expect(sbx.body.state).toBe("pending_build");
    // Both inside their RUN step (the log says "start"), then the server stops.
    const started = (p: string) => async () => {
      const logs = await fetch(`${t.url}/api${p}/build-logs`, { headers: { authorization: `Bearer ${adminKey}` } }).then((r) => r.text());
      return /^start$/m.test(logs) ? true : undefined;
    };
    await until("the snapshot's RUN", started(`/snapshots/${snap.body.id}`));
    await until("the sandbox's RUN", started(`/sandbox/${sbx.body.id}`));
    expect((await call("GET", `/sandbox/${sbx.body.id}`)).body.state).toBe("building_snapshot");
    expect((await call("GET", `/snapshots/${snap.body.id}`)).body.state).toBe("building");
    await t.stop({ keepData: true });

    t = await startTestServer({ dataDir, adminKey });
    const done = await until("the snapshot to build again", async () => {
      const r = (await call("GET", `/snapshots/${snap.body.id}`)).body;
      return r.state === "building" || r.state === "pending" ? undefined : r;
    });
    expect(done).toMatchObject({ state: "active", name: "slow-build" });
    const row = (await call("GET", `/sandbox/${sbx.body.id}`)).body;
    expect(row.state).toBe("build_failed");
    expect(row.errorReason).toMatch(/cancelled|interrupted by a restart/);
    // The failed sandbox can be deleted.
    expect((await call("DELETE", `/sandbox/${sbx.body.id}`)).status).toBe(200);
  }, 400_000);

  it("stops a build that runs past its time limit, with a reason saying so", async () => {
    const rt = t.server.sandboxes.runtime;
    if (!rt.images) throw new Error("this test needs the linux runtime (root)");
    const builder = new Builder({ targets: async () => ({ runnerId: rt.runnerId, runtime: rt }), contexts: t.server.objectStorage.contexts, credentialsFor: registryAccount(reg), timeoutMs: 3_000 });
    const org = (await call("GET", "/organizations")).body[0].id as string;
    // The RUN step outlasts the test's own timeout: an answer at all means the limit stopped it.
    const info = checkBuildInfo({ dockerfileContent: dockerfile(600), contextHashes: ["sleepctx"] } as CreateBuildInfo);
    const err = await builder.build(org, info).then(() => undefined, (e: unknown) => e as Error);
    expect(err?.message).toBe("The build ran longer than 3 seconds and was stopped");
    expect(await (await rt.images()).built(Builder.key(org, info))).toBeUndefined();
  }, 120_000);

  it("refuses a context archive whose entries climb out of the build dir", async () => {
    const rt = t.server.sandboxes.runtime;
    const builder = new Builder({ targets: async () => ({ runnerId: rt.runnerId, runtime: rt }), contexts: t.server.objectStorage.contexts, credentialsFor: registryAccount(reg) });
    const org = (await call("GET", "/organizations")).body[0].id as string;
    const evil = path.join(scratch, "evil", "inner");
    await mkdir(evil, { recursive: true });
    await writeFile(path.join(scratch, "evil", "escape.txt"), "out\n");
    await uploadContext(call, "evilctx", await tarOf(evil, ["../escape.txt"], { preservePaths: true }));
    const info = checkBuildInfo({ dockerfileContent: `FROM ${base}\nRUN echo never\n`, contextHashes: ["evilctx"] } as CreateBuildInfo);
    const err = await builder.build(org, info).then(() => undefined, (e: unknown) => e as Error);
    expect(err?.message).toMatch(/Build context evilctx is not a readable tar archive: .*\.\./);
  }, 120_000);
});
