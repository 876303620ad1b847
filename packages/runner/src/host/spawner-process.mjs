// The spawner's own process (see spawner.ts): a small node that starts commands for the runner.
// A fork copies the forking process's page tables: from a 230 MB server it costs 7-8 ms, from
// this process 1.5-2. Plain JavaScript: started once per runner process, without type stripping.
// Requests and answers are JSON messages on the IPC channel; it exits when the channel closes.
// It is in the runner's process group, so a Ctrl-C or a `kill -- -pgid` reaches it too: it
// ignores them, since the runner's shutdown (unmounts, loop devices, cgroups) runs its commands
// through it; it goes when the runner ends it or dies (the channel closes either way).
import { spawn } from "node:child_process";
import { closeSync, openSync, writeFileSync } from "node:fs";

const CAP = 65536;
// An answer the runner can no longer take (it exited) is dropped; the channel's close ends this process.
const send = (m) => process.connected && process.send(m, () => undefined);

function run({ id, cmd, args, cwd, env, input }) {
  let child;
  try {
    // Its own process group: a signal to the runner's group must not cut a teardown's umount short.
    child = spawn(cmd, args, { stdio: [input === undefined ? "ignore" : "pipe", "pipe", "pipe"], env, cwd, detached: true });
  } catch (err) {
    return send({ id, error: `cannot run ${cmd}: ${err.message}` });
  }
  if (input !== undefined) {
    child.stdin.on("error", () => undefined);
    child.stdin.end(input);
  }
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c) => (stdout = stdout.length > CAP ? stdout : stdout + c.toString()));
  child.stderr.on("data", (c) => (stderr = stderr.length > CAP ? stderr : stderr + c.toString()));
  let failed = false;
  child.on("error", (err) => {
    failed = true;
    send({ id, error: `cannot run ${cmd}: ${err.message}` });
  });
  child.on("close", (code, signal) => failed || send({ id, code, signal, stdout, stderr }));
}

/** launcher.ts's launch(), the descriptors opened here: the log on 1 and 2, bwrap's options on a pipe at 3, the filter at 4. */
function launch({ id, cmd, args, logFile, seccompFile, pipe3, oomScoreAdj }) {
  let log;
  let filter;
  try {
    log = openSync(logFile, "w", 0o600);
    filter = seccompFile ? openSync(seccompFile, "r") : undefined;
    const child = spawn(cmd, args, { stdio: ["ignore", log, log, "pipe", filter ?? "ignore"], detached: true, env: {} });
    let oomScoreDenied = false;
    if (oomScoreAdj !== undefined && child.pid !== undefined) {
      try {
        writeFileSync(`/proc/${child.pid}/oom_score_adj`, String(oomScoreAdj));
      } catch (err) {
        if (err.code === "EACCES" || err.code === "EPERM") oomScoreDenied = true;
        else if (err.code !== "ENOENT" && err.code !== "ESRCH") throw err;
      }
    }
    child.stdio[3].on("error", () => undefined); // bwrap died before reading: reported via exit
    child.stdio[3].end(Buffer.from(pipe3, "base64"));
    child.on("error", (err) => send({ id, exit: true, code: null, signal: null, error: err.message }));
    child.on("exit", (code, signal) => send({ id, exit: true, code, signal }));
    child.unref();
    send({ id, pid: child.pid, oomScoreDenied });
  } catch (err) {
    send({ id, error: err.message });
  } finally {
    if (log !== undefined) closeSync(log);
    if (filter !== undefined) closeSync(filter);
  }
}

for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => undefined);
process.on("message", (m) => (m.op === "launch" ? launch(m) : run(m)));
process.on("disconnect", () => process.exit(0));
send({ ready: true });
