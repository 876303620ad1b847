import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort } from "@sandbar/runner/free-port";

// The embedded registry never outlives its server, even one killed with SIGKILL (crash tests and
// real crashes run no exit handler): a real docker-registry started by a real node process.

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "sandbar-registry-process-"));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe("the embedded registry process", () => {
  it("dies with a server killed by SIGKILL", async () => {
    const address = `127.0.0.1:${await freePort()}`;
    const script = `
      import { signingKey, startRegistryProcess } from ${JSON.stringify(path.join(import.meta.dirname, "registry-process.ts"))};
      const key = await signingKey(${JSON.stringify(dir)});
      const p = await startRegistryProcess({ dir: ${JSON.stringify(dir)}, address: ${JSON.stringify(address)}, realm: "http://127.0.0.1:1/token", certPath: key.certPath, log: () => {} });
      console.log("pid " + p.pid);
      setInterval(() => {}, 1000);`;
    const server = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    const pid = await new Promise<number>((resolve, reject) => {
      server.stdout.on("data", (c: Buffer) => {
        const m = /pid (\d+)/.exec(c.toString());
        if (m) resolve(Number(m[1]));
      });
      server.on("exit", (code) => reject(new Error(`the server exited early (${code})`)));
    });
    expect(alive(pid)).toBe(true);
    expect((await fetch(`http://${address}/v2/`)).status).toBe(401);
    server.kill("SIGKILL");
    const until = Date.now() + 10_000;
    while (alive(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    // Reaped by init once killed; a zombie would still answer kill(0), so poll the port as well.
    expect(alive(pid)).toBe(false);
    expect(await fetch(`http://${address}/v2/`).then(() => "answers", () => "gone")).toBe("gone");
  }, 30_000);
});

describe("a registry that dies", () => {
  it("is started again on its address after a pause, and stays stopped once stopped", async () => {
    const { signingKey, startRegistryProcess } = await import("./registry-process.ts");
    const own = path.join(dir, "restart");
    const key = await signingKey(dir);
    const address = `127.0.0.1:${await freePort()}`;
    const lines: string[] = [];
    const p = await startRegistryProcess({ dir: own, address, realm: "http://127.0.0.1:1/token", certPath: key.certPath, log: (l) => lines.push(l) });
    try {
      const first = p.pid;
      process.kill(first, "SIGKILL");
      const until = Date.now() + 15_000;
      const status = () => fetch(`http://${address}/v2/`).then((r) => r.status, () => 0);
      while ((p.pid === first || (await status()) !== 401) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
      expect(p.pid).not.toBe(first);
      expect((await fetch(`http://${address}/v2/`)).status).toBe(401);
      expect(lines.some((l) => l.startsWith("internal registry: docker-registry exited (SIGKILL)"))).toBe(true);
      expect(lines).toContain(`internal registry: restarted on ${address}`);
    } finally {
      await p.stop();
    }
    expect(await fetch(`http://${address}/v2/`).then(() => "answers", () => "gone")).toBe("gone");
  }, 30_000);
});
