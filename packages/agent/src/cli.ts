/**
 * What the agent's entry points run (main.ts for the bundle, snapshot.ts for the
 * startup snapshot): the sandbox's first process.
 *   node main.ts --socket <path> (--secret-file <path> | env SANDBAR_AGENT_SECRET)
 *                [--port 2280] [--host 0.0.0.0] [--root <dir>] [--state-dir <dir>] [--shell <path>] [--preload]
 *                [--user-cgroup <procs file>]...
 * Prints one JSON line {"event":"ready",...} on stdout once it serves.
 * --user-cgroup: where the processes it starts for the user go (see process/user-spawn.ts).
 * SANDBAR_AGENT_RESTARTS (set by the sandbox's supervising init): how many times this agent was
 * restarted; 0 or unset is a fresh start, which clears what an earlier run left in --state-dir.
 */
import { readFileSync, rmSync } from "node:fs";
import * as path from "node:path";
import { parseArgs } from "node:util";
import { becomeInitIfPid1, INIT_MARKER } from "./init.ts";
import { startAgent } from "./agent.ts";
import { setUserCgroup } from "./process/user-spawn.ts";
import { isBrokenPipe, writeErr, writeOut } from "./util/stdio.ts";

function fail(message: string): never {
  writeErr(`sandbar-agent: ${message}\n`);
  process.exit(2);
}

/** Parses the command line, becomes init when PID 1, starts the agent and prints its ready line. */
export async function runAgent(): Promise<void> {
  const { values } = (() => {
    try {
      return parseArgs({
        options: {
          socket: { type: "string" },
          "secret-file": { type: "string" },
          port: { type: "string" },
          host: { type: "string" },
          root: { type: "string" },
          "state-dir": { type: "string" },
          shell: { type: "string" },
          preload: { type: "boolean" },
          "user-cgroup": { type: "string", multiple: true },
        },
        strict: true,
      });
    } catch (err) {
      return fail((err as Error).message);
    }
  })();

  if (!values.socket) fail("--socket <path> is required");
  let secret = process.env.SANDBAR_AGENT_SECRET;
  if (values["secret-file"]) {
    try {
      secret = readFileSync(values["secret-file"], "utf8").trim();
    } catch (err) {
      fail(`cannot read the secret file: ${(err as Error).message}`);
    }
  }
  if (!secret) fail("a secret is required: --secret-file <path> or SANDBAR_AGENT_SECRET");
  let port: number | undefined;
  if (values.port !== undefined) {
    port = Number(values.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535) fail(`invalid --port: ${values.port}`);
  }

  if (becomeInitIfPid1(process.argv.slice(1), process.execArgv)) {
    // Not reached: execve replaced this process.
  } else {
    // Children must never see the secret.
    delete process.env.SANDBAR_AGENT_SECRET;
    // Started by a supervising init (the sandbox's, or the agent's own when it was pid 1) that is
    // pid 1 of this pid namespace: a sandbox's agent.
    const sandboxed = process.ppid === 1 && (process.env.SANDBAR_AGENT_RESTARTS !== undefined || process.env[INIT_MARKER] === "1");
    delete process.env[INIT_MARKER];
    const restarts = Number(process.env.SANDBAR_AGENT_RESTARTS ?? "0") || 0;
    delete process.env.SANDBAR_AGENT_RESTARTS;
    setUserCgroup(values["user-cgroup"] ?? []);
    // A fresh start owes nothing to an earlier run's sessions; a restart keeps their logs on disk.
    // (Synchronous, as everything up to the listen: see startAgent.)
    if (restarts === 0 && values["state-dir"]) {
      try {
        rmSync(path.join(values["state-dir"], "sessions"), { recursive: true, force: true });
      } catch {
        // what cannot be removed stays; new sessions get new names
      }
    }

    // Signals are handled from here on: the socket accepts before startup ends (the tunnel socket and
    // the TCP port come after it), and a stop in that window must still be a graceful one.
    let agent: Awaited<ReturnType<typeof startAgent>> | undefined;
    let stopping = false;
    const stop = (signal: NodeJS.Signals) => {
      if (stopping) return;
      stopping = true;
      writeErr(`sandbar-agent: stopping on ${signal}\n`);
      if (!agent) return void process.exit(0); // still starting: nothing to close yet
      agent.close().then(
        () => process.exit(0),
        (err: unknown) => {
          agent!.context.log(`shutdown after ${signal} failed`, err);
          process.exit(1);
        },
      );
    };
    for (const s of ["SIGTERM", "SIGINT", "SIGHUP"] as const) process.on(s, () => stop(s));

    const started = await startAgent({
      socketPath: values.socket,
      secret,
      port,
      host: values.host,
      root: values.root,
      stateDir: values["state-dir"],
      shell: values.shell,
      preload: values.preload,
      sandboxed,
    }).catch((err: unknown) => fail(`cannot start: ${(err as Error).message}`));
    agent = started;

    // No request may take the agent down: report what escaped and go on serving.
    // (A caller or reader that went away is no news.)
    process.on("uncaughtException", (err) => isBrokenPipe(err) || started.context.log("uncaught exception", err));
    process.on("unhandledRejection", (err) => isBrokenPipe(err) || started.context.log("unhandled rejection", err));

    // readyMs: time since this process started (node's own boot included); cpuMs: CPU time spent so far.
    // (process.uptime, not performance.now: the latter loads perf_hooks.)
    const readyMs = Math.round(process.uptime() * 10000) / 10;
    const cpu = process.cpuUsage();
    const cpuMs = Math.round((cpu.user + cpu.system) / 100) / 10;
    writeOut(JSON.stringify({ event: "ready", socket: started.socketPath, port: started.port, pid: process.pid, readyMs, cpuMs, restarts }) + "\n");
  }
}
