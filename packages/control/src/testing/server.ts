import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startControlServer, type ControlOptions, type ControlServer } from "../server/control-server.ts";
import { loadSettings, type Settings } from "../settings.ts";
import { freePort } from "@sandbar/runner/free-port";
import type { UntypedJson } from "../casts.ts";

/**
 * Where test servers build and cache the default snapshot: shared with the runner's tests, so
 * the debootstrap build (minutes) happens once per machine. Override with SANDBAR_TEST_CACHE_DIR.
 */
export const TEST_SNAPSHOT_CACHE = process.env.SANDBAR_TEST_CACHE_DIR ?? "/var/tmp/sandbar-runner-test-cache";

export interface TestServer {
  server: ControlServer;
  url: string;
  /** The bootstrap admin key (full scope, manager of the default organization). */
  adminKey: string;
  dataDir: string;
  /** Stops the server; `keepData` leaves the data dir for a restart. */
  stop(opts?: { keepData?: boolean }): Promise<void>;
}

/** A real control server on a free loopback port with its own data dir (embedded PostgreSQL). */
export async function startTestServer(
  opts: { dataDir?: string; databaseUrl?: string; adminKey?: string; control?: ControlOptions; settings?: Partial<Settings> } = {},
): Promise<TestServer> {
  const dataDir = opts.dataDir ?? (await mkdtemp(join(tmpdir(), "sandbar-test-")));
  const adminKey = opts.adminKey ?? "sbr_" + randomBytes(32).toString("hex");
  // A known port up front, so the URLs the API hands out (toolbox, preview) point at this server.
  const port = opts.settings?.port ?? (await freePort());
  const settings = {
    ...loadSettings({}),
    port,
    publicUrl: `http://127.0.0.1:${port}`,
    host: "127.0.0.1",
    dataDir,
    databaseUrl: opts.databaseUrl,
    bootstrapApiKey: adminKey,
    snapshotCacheDir: TEST_SNAPSHOT_CACHE,
    // Suites count and inspect their sandboxes; the pool's own suite turns it on.
    warmPool: 0,
    // A registry process per test server only where a suite asks for one.
    internalRegistry: { enabled: false as const },
    ...opts.settings,
  };
  const server = await startControlServer(settings, () => {}, opts.control);
  return {
    server,
    url: server.url,
    adminKey,
    dataDir,
    async stop({ keepData = false } = {}) {
      // A data dir that goes away takes its sandboxes along (mounts, cgroups, processes).
      if (!keepData && !opts.dataDir) {
        const { runtime } = server.sandboxes;
        for (const s of await runtime.list()) await runtime.destroy(s.id).catch(() => undefined);
      }
      await server.stop();
      if (!keepData && !opts.dataDir) await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** fetch against the REST API with a bearer key; returns status and parsed body. */
export async function api(base: string, key: string | undefined, method: string, path: string, body?: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${base}/api${path}`, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(body === undefined ? {} : { "content-type": "application/json" }), ...headers },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: UntypedJson = undefined;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = text;
  }
  return { status: res.status, body: json, headers: res.headers };
}

export { buildAgentBundle } from "./agent-bundle.ts";
export { bulkUpload } from "./bulk-upload.ts";
export { sandboxCgroup } from "./sandbox-cgroup.ts";
