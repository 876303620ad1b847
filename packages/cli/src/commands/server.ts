import type { Command } from "commander";
import { serveUntilSignal } from "../stop-on-signal.ts";

// The server's modules load only for these commands: the client commands stay quick to start.
export function serverCommands(program: Command): void {
  program
    .command("serve")
    .description("run the control service (and, on one host, its runner)")
    .action(async () => {
      const { loadSettings, startControlServer } = await import("@sandbar/control");
      const settings = loadSettings();
      const log = (line: string) => console.log(`[sandbar] ${line}`);
      log(`data dir: ${settings.dataDir}${settings.databaseUrl ? "" : " (embedded PostgreSQL)"}`);
      let server: Awaited<ReturnType<typeof startControlServer>>;
      try {
        server = await serveUntilSignal(() => startControlServer(settings, log), log, "shutting down");
      } catch (err) {
        console.error(`[sandbar] failed to start: ${err instanceof Error ? err.message : String(err)}`);
        process.exitCode = 1;
        return;
      }
      log(`listening on ${settings.host}:${server.port}: REST under /api, Connect/gRPC/gRPC-Web on the same port`);
    });

  program
    .command("runner")
    .description("run a runner: this host's sandboxes, served to a control service (settings SANDBAR_RUNNER_*)")
    .action(async () => {
      // The daemon is the runner package's; the runtime it serves is control's LocalRuntime.
      const { loadSettings, openRunnerRuntime } = await import("@sandbar/control");
      const { loadRunnerHostSettings, startRunner } = await import("@sandbar/runner/daemon");
      const settings = loadSettings();
      const host = loadRunnerHostSettings();
      const log = (line: string) => console.log(`[sandbar runner] ${line}`);
      log(`data dir: ${settings.dataDir}`);
      let runner: Awaited<ReturnType<typeof startRunner>>;
      try {
        runner = await serveUntilSignal(() => startRunner(openRunnerRuntime(settings, log), host, log), log, "shutting down (sandboxes keep running)");
      } catch (err) {
        console.error(`[sandbar runner] failed to start: ${err instanceof Error ? err.message : String(err)}`);
        process.exitCode = 1;
        return;
      }
      log(`runner ${runner.runnerId} listening on ${host.host}:${runner.server.port} (${host.tls ? "TLS" : "h2c"})`);
    });

  program
    .command("doctor")
    .description("say what this host offers sandboxes and what is missing (exit 1 when something required is)")
    .action(async () => {
      const { checkHost, formatChecks } = await import("@sandbar/runner/linux");
      const checks = await checkHost();
      for (const line of formatChecks(checks)) console.log(line);
      process.exitCode = checks.some((c) => c.required && !c.ok) ? 1 : 0;
    });
}
