import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sh } from "../sandboxes/testing/agent-client.ts";
import { RemoteRuntime } from "./remote-runtime.ts";
import { type RunnerProcess, startRunnerProcess } from "./testing/runner-process.ts";

// A runner process serving TLS (a CA and a certificate for 127.0.0.1 made by openssl here):
// control's client verifies it with the CA, refuses it without; a sandbox's agent is reached
// through a TLS agent stream.

const root = process.getuid?.() === 0;
let dir: string;
let runner: RunnerProcess;
let ca: string;

beforeAll(async () => {
  if (!root) return;
  dir = await mkdtemp(path.join(tmpdir(), "sandbar-runner-tls-"));
  const f = (n: string) => path.join(dir, n);
  const ssl = (...args: string[]) => execFileSync("openssl", args, { stdio: "ignore" });
  ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f("ca.key"), "-out", f("ca.pem"), "-days", "2", "-subj", "/CN=sandbar test CA");
  ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f("runner.key"), "-out", f("runner.csr"), "-subj", "/CN=127.0.0.1");
  await import("node:fs/promises").then((fs) => fs.writeFile(f("ext.cnf"), "subjectAltName=IP:127.0.0.1\n"));
  ssl("x509", "-req", "-in", f("runner.csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial", "-out", f("runner.pem"), "-days", "2", "-extfile", f("ext.cnf"));
  ca = await readFile(f("ca.pem"), "utf8");
  runner = await startRunnerProcess({ env: { SANDBAR_RUNNER_TLS_CERT: f("runner.pem"), SANDBAR_RUNNER_TLS_KEY: f("runner.key") } });
}, 120_000);

afterAll(async () => {
  await runner?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe.skipIf(!root)("a runner over TLS", () => {
  it("is reached with its CA (RPCs and an agent stream) and refused without it", async () => {
    const { url } = runner;
    await expect(RemoteRuntime.open({ url, credential: runner.credential })).rejects.toThrow(/certificate/);
    const remote = await RemoteRuntime.open({ url, credential: runner.credential, ca });
    const id = randomUUID();
    try {
      await remote.create({ id, cpu: 1, memoryGiB: 1, diskGiB: 3, env: {}, user: "sandbar" });
      const agent = await remote.connectAgent(id);
      expect(await sh(agent, "echo over tls")).toEqual({ exitCode: 0, result: "over tls\n" });
    } finally {
      await remote.destroy(id);
      await remote.close();
    }
  }, 120_000);
});
