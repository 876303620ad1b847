#!/usr/bin/env node
import { loadRunnerHostSettings, loadSettings, startControlServer, startRunner } from "@sandbar/control";
import { checkHost, formatChecks } from "@sandbar/runner/linux";

const usage = `usage: sandbar serve    run the control service (and, on one host, its runner)
       sandbar runner   run a runner: this host's sandboxes, served to a control service (SANDBAR_RUNNER_*)
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

async function runner(): Promise<void> {
  const settings = loadSettings();
  const host = loadRunnerHostSettings();
  const log = (line: string) => console.log(`[sandbar runner] ${line}`);
  log(`data dir: ${settings.dataDir}`);
  const r = await startRunner(settings, host, log);
  log(`runner ${r.runnerId} listening on ${host.host}:${r.server.port} (${host.tls ? "TLS" : "h2c"})`);
  const shutdown = (signal: string) => {
    log(`${signal}: shutting down (sandboxes keep running)`);
    r.stop().then(
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
} else if (command === "runner") {
  runner().catch((err) => {
    console.error(`[sandbar runner] failed to start: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  });
} else if (command === "doctor") {
  doctor().then((code) => process.exit(code));
} else {
  console.error(usage);
  process.exit(2);
}
