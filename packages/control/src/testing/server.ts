import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startControlServer, type ControlOptions, type ControlServer } from "../server/control-server.ts";
import { loadSettings } from "../settings.ts";

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
  opts: { dataDir?: string; databaseUrl?: string; adminKey?: string; control?: ControlOptions } = {},
): Promise<TestServer> {
  const dataDir = opts.dataDir ?? (await mkdtemp(join(tmpdir(), "sandbar-test-")));
  const adminKey = opts.adminKey ?? "sbr_" + randomBytes(32).toString("hex");
  const settings = {
    ...loadSettings({}),
    port: 0,
    host: "127.0.0.1",
    dataDir,
    databaseUrl: opts.databaseUrl,
    bootstrapApiKey: adminKey,
  };
  const server = await startControlServer(settings, () => {}, opts.control);
  return {
    server,
    url: server.url,
    adminKey,
    dataDir,
    async stop({ keepData = false } = {}) {
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
  let json: any = undefined;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = text;
  }
  return { status: res.status, body: json, headers: res.headers };
}
