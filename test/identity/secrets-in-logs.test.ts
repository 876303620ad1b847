/**
 * `sandbar serve` as an operator runs it: a child process on a fresh data dir, its stdout and
 * stderr captured whole. The generated admin API key and password go into 0600 files; the log
 * says where they are, and holds their values only when SANDBAR_PRINT_SECRETS asks for it.
 */
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "@sandbar/runner/free-port";
import { describe, expect, it } from "vitest";
import { TEST_SNAPSHOT_CACHE } from "../../packages/control/src/testing/server.ts";
import { CLI } from "../cli/run-cli.ts";

/** Starts `sandbar serve` on a new data dir, waits until it listens, stops it; answers everything it wrote. */
async function firstStart(env: Record<string, string>): Promise<{ output: string; dataDir: string }> {
  const dataDir = await mkdtemp(join(tmpdir(), "sandbar-secrets-"));
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SANDBAR_")));
  const child = spawn(process.execPath, [CLI, "serve"], {
    env: {
      ...base,
      SANDBAR_DATA_DIR: dataDir,
      SANDBAR_HOST: "127.0.0.1",
      SANDBAR_PORT: String(await freePort()),
      SANDBAR_WARM_POOL: "0",
      SANDBAR_SNAPSHOT_CACHE: TEST_SNAPSHOT_CACHE,
      SANDBAR_INTERNAL_REGISTRY: "off",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  await new Promise<void>((resolve, reject) => {
    const take = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes("listening on")) resolve();
    };
    child.stdout.on("data", take);
    child.stderr.on("data", take);
    void exited.then((code) => reject(new Error(`serve exited (${code}) before listening:\n${output}`)));
  });
  child.kill("SIGTERM");
  await exited;
  return { output, dataDir };
}

describe("the first start's log", () => {
  it("names the files holding the admin API key and password, never their values", async () => {
    const { output, dataDir } = await firstStart({});
    try {
      const keyFile = join(dataDir, "admin-api-key");
      const passwordFile = join(dataDir, "admin-password");
      const key = (await readFile(keyFile, "utf8")).trim();
      const password = (await readFile(passwordFile, "utf8")).trim();
      expect(key).toMatch(/^sbr_[0-9a-f]{64}$/);
      expect(password.length).toBeGreaterThanOrEqual(20);
      expect(output).not.toContain(key);
      expect(output).not.toContain(password);
      // Nor any long part of them (a value cut or wrapped is still a leak).
      expect(output).not.toContain(key.slice(4, 24));
      expect(output).not.toContain(password.slice(0, 12));
      expect(output).toContain(keyFile);
      expect(output).toContain(passwordFile);
      expect(output).toContain("SANDBAR_PRINT_SECRETS");
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });

  it("prints the values once when SANDBAR_PRINT_SECRETS=true asks for them", async () => {
    const { output, dataDir } = await firstStart({ SANDBAR_PRINT_SECRETS: "true" });
    try {
      const key = (await readFile(join(dataDir, "admin-api-key"), "utf8")).trim();
      const password = (await readFile(join(dataDir, "admin-password"), "utf8")).trim();
      expect(output.split(key)).toHaveLength(2);
      expect(output.split(password)).toHaveLength(2);
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
