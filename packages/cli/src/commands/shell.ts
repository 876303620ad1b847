import { randomBytes } from "node:crypto";
import type { Command } from "commander";
import { PtyService } from "@sandbar/protocol/gen/sandbar/agent/v1/pty_pb.js";
import { openContext } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { ExitCode, run } from "../run.ts";

export function shellCommand(program: Command): void {
  program
    .command("shell")
    .alias("ssh")
    .description("an interactive shell in a sandbox (a terminal of its own; resizes follow this window)")
    .argument("<sandbox>", "sandbox id or name")
    .option("--cwd <dir>", "starting directory")
    .action(
      run(async (sandbox: string, o: { cwd?: string }, globals: GlobalOptions) => {
        const stdin = process.stdin;
        const stdout = process.stdout;
        if (!stdin.isTTY || !stdout.isTTY) throw new CliError("`sandbar shell` needs a terminal: for scripts use `sandbar exec`.", 2);
        const ctx = await openContext(globals);
        const pty = ctx.client(PtyService, sandbox);
        const { sessionId } = await pty.createPty({ id: `cli-${randomBytes(6).toString("hex")}`, cwd: o.cwd, cols: stdout.columns, rows: stdout.rows, lazyStart: true, envs: { TERM: process.env.TERM || "xterm-256color" } });

        // Keystrokes are sent in order, one call at a time (a burst is joined into the next call).
        let pending: Buffer[] = [];
        let sending = false;
        let failure: unknown;
        const flush = async () => {
          if (sending) return;
          sending = true;
          try {
            while (pending.length) {
              const data = Buffer.concat(pending);
              pending = [];
              await pty.sendPtyInput({ sessionId, data });
            }
          } catch (err) {
            failure = err;
            abort.abort();
          } finally {
            sending = false;
          }
        };
        const onInput = (chunk: Buffer) => {
          pending.push(chunk);
          void flush();
        };
        const onResize = () => void pty.resizePty({ sessionId, cols: stdout.columns, rows: stdout.rows }).catch(() => undefined);
        const abort = new AbortController();

        stdin.setRawMode(true);
        stdin.resume();
        stdin.on("data", onInput);
        process.on("SIGWINCH", onResize);
        let exitCode: number | undefined;
        try {
          for await (const event of pty.connectPty({ sessionId }, { signal: abort.signal })) {
            if (event.event.case === "data") {
              if (!stdout.write(event.event.value)) await new Promise((r) => stdout.once("drain", r));
            } else if (event.event.case === "exit") {
              exitCode = event.event.value.exitCode;
              break;
            } else if (event.event.case === "connected") {
              onResize();
            }
          }
          // A stream that ends without the shell's exit is a lost connection, never a clean exit 0.
          if (exitCode === undefined) throw new CliError("the connection to the sandbox's terminal closed before its shell exited", 1);
        } catch (err) {
          if (!abort.signal.aborted) throw err;
          if (failure) throw failure;
        } finally {
          stdin.off("data", onInput);
          process.off("SIGWINCH", onResize);
          stdin.setRawMode(false);
          stdin.pause();
          await pty.deletePty({ sessionId }).catch(() => undefined);
        }
        return new ExitCode(exitCode ?? 1);
      }),
    );
}
