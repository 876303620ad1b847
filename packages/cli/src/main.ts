#!/usr/bin/env node
import { loadSettings, startControlServer } from "@sandbar/control";
import { checkHost, formatChecks } from "@sandbar/runner/linux";

const usage = `usage: sandbar serve    run the control service (and, on one host, its runner)
       sandbar doctor   say what this host offers sandboxes and what is missing`;

/** Exit code 1 when something sandboxes need is missing. */
async function doctor(): Promise<number> {
  const checks = await checkHost();
  for (const line of formatChecks(checks)) console.log(line);
  return checks.some((c) => c.required && !c.ok) ? 1 : 0;
}

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
} else if (command === "doctor") {
  doctor().then((code) => process.exit(code));
} else {
  console.error(usage);
  process.exit(2);
}
