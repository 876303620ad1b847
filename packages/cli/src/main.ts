#!/usr/bin/env node
import { loadSettings, startControlServer } from "@sandbar/control";

const usage = `usage: sandbar serve    run the control service (and, on one host, its runner)`;

async function serve(): Promise<void> {
  const settings = loadSettings();
  const log = (line: string) => console.log(`[sandbar] ${line}`);
  log(`data dir: ${settings.dataDir}${settings.databaseUrl ? "" : " (embedded PostgreSQL)"}`);
  const server = await startControlServer(settings, log);
  log(`listening on ${settings.host}:${server.port}: REST under /api, Connect/gRPC/gRPC-Web on the same port`);
  const shutdown = (signal: string) => {
    log(`${signal}: shutting down`);
    server.stop().then(
      () => process.exit(0),
      (err) => {
        console.error(err);
        process.exit(1);
      },
    );
  };
  process.once("SIGINT", () => shutdown("SIGINT"));
  process.once("SIGTERM", () => shutdown("SIGTERM"));
}

const [command] = process.argv.slice(2);
if (command === "serve" || command === undefined) {
  serve().catch((err) => {
    console.error(`[sandbar] failed to start: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  });
} else {
  console.error(usage);
  process.exit(2);
}
