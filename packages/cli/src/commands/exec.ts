import { randomBytes } from "node:crypto";
import type { Command } from "commander";
import { ProcessService, type LogChunk } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { openContext, type Context } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { ExitCode, run } from "../run.ts";
import { keyValue } from "./parse.ts";

/** POSIX shell quoting of one word. */
export function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/** One word is a shell script as written; several are a command line, each word quoted. */
export function scriptOf(words: string[], opts: { cwd?: string; env?: Record<string, string> } = {}): string {
  const command = words.length === 1 ? words[0]! : words.map(shellQuote).join(" ");
  const env = Object.entries(opts.env ?? {}).map(([k, v]) => {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new CliError(`--env name "${k}" is not a variable name (letters, digits, _).`, 2);
    return `export ${k}=${shellQuote(v)}; `;
  });
  return (opts.cwd ? `cd ${shellQuote(opts.cwd)} && ` : "") + env.join("") + command;
}

/** Writes a command's log chunks to our stdout and stderr as they come (waiting when a pipe is full). */
async function pump(chunks: AsyncIterable<LogChunk>): Promise<void> {
  for await (const chunk of chunks) {
    const { case: stream, value } = chunk.data;
    if (!value) continue;
    const target = stream === "stderr" ? process.stderr : process.stdout;
    if (!target.write(value)) await new Promise((r) => target.once("drain", r));
  }
}

async function commandExit(ctx: Context, sandbox: string, sessionId: string, commandId: string): Promise<number | undefined> {
  const process_ = ctx.client(ProcessService, sandbox);
  for (let i = 0; i < 50; i++) {
    const cmd = await process_.getSessionCommand({ sessionId, commandId });
    if (cmd.exitCode !== undefined) return cmd.exitCode;
    await new Promise((r) => setTimeout(r, 100));
  }
  return undefined;
}

export function execCommands(program: Command): void {
  program
    .command("exec")
    .description("run a command in a sandbox: its output streams here, its exit code becomes ours")
    .argument("<sandbox>", "sandbox id or name")
    .argument("<command...>", "a shell script (one word) or a command and its arguments; put -- before a command with options")
    .option("--cwd <dir>", "working directory in the sandbox")
    .option("-e, --env <KEY=VALUE>", "an environment variable (repeatable)", keyValue("--env"))
    .option("--session <id>", "run in this session (created when missing) and keep it, rather than in a throwaway one")
    .option("-d, --detach", "start the command and print its id without waiting (needs --session; follow it with `sandbar logs -f`)")
    .addHelpText("after", "\nExamples:\n  sandbar exec my-box 'ls -l / | head'\n  sandbar exec my-box -- python3 -c 'print(42)'\n  sandbar exec --session build -d my-box 'make all'   # then: sandbar logs -f my-box build CMD_ID")
    .action(
      run(async (sandbox: string, words: string[], o: { cwd?: string; env?: Record<string, string>; session?: string; detach?: boolean }, globals: GlobalOptions) => {
        if (o.detach && !o.session) throw new CliError("--detach needs --session NAME, so the command can be followed with `sandbar logs -f SANDBOX NAME CMD_ID`.", 2);
        const script = scriptOf(words, o);
        const ctx = await openContext(globals);
        const proc = ctx.client(ProcessService, sandbox);
        const sessionId = o.session ?? `cli-exec-${randomBytes(6).toString("hex")}`;
        const sessions = await proc.listSessions({});
        if (!sessions.sessions.some((s) => s.sessionId === sessionId)) await proc.createSession({ sessionId });
        const cleanup = async () => {
          if (!o.session) await proc.deleteSession({ sessionId }).catch(() => undefined);
        };
        const abort = new AbortController();
        const onSignal = () => abort.abort();
        process.once("SIGINT", onSignal);
        try {
          const started = await proc.sessionExecute({ sessionId, command: script, runAsync: true });
          if (o.detach) {
            ctx.out.result({ sandbox, sessionId, commandId: started.cmdId }, () => console.log(started.cmdId));
            return;
          }
          await pump(proc.streamSessionCommandLogs({ sessionId, commandId: started.cmdId, follow: true }, { signal: abort.signal })).catch((err) => {
            if (abort.signal.aborted) throw new CliError("Interrupted; the command was stopped.", 130);
            throw err;
          });
          const code = await commandExit(ctx, sandbox, sessionId, started.cmdId);
          if (code === undefined) throw new CliError(`The command's output ended but it has no exit code yet: \`sandbar logs ${sandbox} ${sessionId} ${started.cmdId}\`.`);
          return new ExitCode(code);
        } finally {
          process.off("SIGINT", onSignal);
          await cleanup();
        }
      }),
    );

  program
    .command("logs")
    .description("print (or, with -f, follow) the output of a command run in a session")
    .argument("<sandbox>", "sandbox id or name")
    .argument("<session>", "session id")
    .argument("[command]", "command id; default: the session's latest command")
    .option("-f, --follow", "keep printing until the command exits")
    .action(
      run(async (sandbox: string, sessionId: string, commandId: string | undefined, o: { follow?: boolean }, globals: GlobalOptions) => {
        const ctx = await openContext(globals);
        const proc = ctx.client(ProcessService, sandbox);
        if (!commandId) {
          const session = await proc.getSession({ sessionId });
          const last = session.commands.at(-1);
          if (!last) throw new CliError(`Session ${sessionId} has run no command yet.`);
          commandId = last.id;
        }
        await pump(proc.streamSessionCommandLogs({ sessionId, commandId, follow: Boolean(o.follow) }));
      }),
    );
}
