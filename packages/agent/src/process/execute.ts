import { randomUUID } from "node:crypto";
import { statSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import * as path from "node:path";
import { constants } from "node:os";
import { errors } from "@sandbar/protocol";
import type { AgentContext } from "../context.ts";
import { fsCall, fsError } from "../util/fs-errors.ts";
import { resolvePath } from "../util/paths.ts";
import { envProblem, shellQuote } from "../util/shell.ts";
import { signalTree } from "../util/kill.ts";
import type { LaunchedShell, ShellLauncher } from "./launcher.ts";

/** Most output an execution answers with; the rest is counted, not kept. */
const RESULT_LIMIT = 32 * 1024 * 1024;
/** Scripts longer than this go through a file: a single argv entry is limited to 128 KiB. */
const INLINE_LIMIT = 100 * 1024;
/** After the shell exits, how long background processes that kept its output open are waited for. */
export const DRAIN_MS = 100;

export interface ExecuteInput {
  command: string;
  cwd?: string;
  envs: Record<string, string>;
  /** Seconds; 0 or undefined: none. */
  timeout?: number;
}

export interface ExecuteOutput {
  exitCode: number;
  result: string;
}

/** Checks an execution's cwd and env; returns the cwd to use. */
async function prepareExecution(ctx: AgentContext, input: ExecuteInput): Promise<string> {
  if (input.command.trim() === "") throw errors.invalidArgument("command is required");
  const badEnv = envProblem(input.envs);
  if (badEnv) throw errors.invalidArgument(badEnv);
  const cwd = input.cwd ? resolvePath(ctx.workDir, input.cwd, "cwd") : ctx.workDir;
  let st;
  try {
    st = statSync(cwd);
  } catch (err) {
    throw fsError(err, cwd);
  }
  if (!st.isDirectory()) throw errors.invalidArgument(`cwd is not a directory: ${cwd}`);
  return cwd;
}

/**
 * Runs a shell script in its own process group, stdout and stderr interleaved
 * into one result. Past the timeout (or when the caller goes away) the whole
 * group is killed; a timeout fails with DEADLINE_EXCEEDED.
 */
export async function execute(ctx: AgentContext, launcher: ShellLauncher, input: ExecuteInput, signal?: AbortSignal): Promise<ExecuteOutput> {
  const cwd = await prepareExecution(ctx, input);
  let scriptFile: string | undefined;
  let script = input.command;
  if (Buffer.byteLength(script) > INLINE_LIMIT) {
    scriptFile = path.join(ctx.stateDir, `exec-${randomUUID()}.sh`);
    const file = scriptFile;
    await fsCall(file, () => writeFile(file, script, { mode: 0o600 }));
    script = `. ${shellQuote(scriptFile)}`;
  }
  try {
    return await run(await launcher.launch(`exec 2>&1\n${script}`, cwd, input.envs), input, signal);
  } finally {
    launcher.refillSoon();
    if (scriptFile) await rm(scriptFile, { force: true });
  }
}

function run(child: LaunchedShell, input: ExecuteInput, signal?: AbortSignal): Promise<ExecuteOutput> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let kept = 0;
    let dropped = 0;
    const collect = (chunk: Buffer) => {
      const room = RESULT_LIMIT - kept;
      if (room >= chunk.length) {
        chunks.push(chunk);
        kept += chunk.length;
      } else {
        if (room > 0) chunks.push(chunk.subarray(0, room));
        kept += Math.max(0, room);
        dropped += chunk.length - Math.max(0, room);
      }
    };
    // A subshell's output is one pipe (stderr null); a shell of its own has two.
    const outputs = [child.stdout!, ...(child.stderr ? [child.stderr] : [])];
    for (const o of outputs) o.on("data", collect);
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const kill = () => {
      if (child.pid !== undefined) signalTree(child.pid, "SIGKILL");
    };
    const onAbort = () => kill();
    const finish = (out: ExecuteOutput | Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (out instanceof Error) reject(out);
      else resolve(out);
    };
    if (input.timeout) {
      timer = setTimeout(() => {
        kill();
        finish(errors.deadlineExceeded(`command execution timeout: still running after ${input.timeout} s, killed`));
      }, input.timeout * 1000);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    child.once("error", (err) => finish({ exitCode: -1, result: err.message }));
    child.once("exit", (code, sig) => {
      const done = () => {
        if (settled) return;
        let result = Buffer.concat(chunks).toString("utf8");
        if (dropped > 0) result += `\n[output truncated: ${dropped} more bytes]\n`;
        finish({ exitCode: code ?? 128 + (sig ? (constants.signals[sig] ?? 0) : 0), result });
      };
      // Output may still be in flight; background children may hold the pipes open for good.
      let open = outputs.length;
      const grace = setTimeout(() => {
        // Judged after this turn's poll phase (setImmediate runs after it), not before it: node
        // reaps every child that has exited on any SIGCHLD, so this shell can be reaped before its
        // output (already in the pipes: it has exited) is read, and on an agent starved past
        // DRAIN_MS the output was dropped (answered with its exit code and no output).
        setImmediate(() => {
          for (const o of outputs) if (!o.readableEnded) o.destroy();
          done();
        });
      }, DRAIN_MS);
      const closed = () => {
        if (--open === 0) {
          clearTimeout(grace);
          done();
        }
      };
      for (const o of outputs) {
        if (o.readableEnded || o.destroyed) closed();
        else o.once("close", closed);
      }
    });
  });
}
