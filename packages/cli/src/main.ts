#!/usr/bin/env node
import { Command, CommanderError, Option } from "commander";
import { authCommands } from "./commands/auth.ts";
import { changesCommand } from "./commands/changes.ts";
import { completionCommand } from "./commands/completion.ts";
import { execCommands } from "./commands/exec.ts";
import { filesCommands } from "./commands/files.ts";
import { keyCommands } from "./commands/key.ts";
import { sandboxCommands } from "./commands/sandbox.ts";
import { serverCommands } from "./commands/server.ts";
import { shellCommand } from "./commands/shell.ts";
import { snapshotCommands } from "./commands/snapshot.ts";
import { volumeCommands } from "./commands/volume.ts";
import { EXIT } from "./failure.ts";
import { colorWanted } from "./output.ts";
import { lifetime } from "./run.ts";

export function buildProgram(): Command {
  const program = new Command("sandbar")
    .description("Sandbar: self-hosted sandboxes. Sign in with `sandbar login`, then work with sandboxes.")
    .addOption(new Option("--json", "print results as JSON (for scripts)"))
    .addOption(new Option("--debug", "print stack traces of failures"))
    .addOption(new Option("--profile <name>", "config file profile to use").env("SANDBAR_PROFILE"))
    .addOption(new Option("--api-url <url>", "the API's URL, ending in /api").env("SANDBAR_API_URL"))
    .showSuggestionAfterError()
    .configureHelp({ showGlobalOptions: true, sortSubcommands: false })
    .configureOutput({
      outputError: (text, write) => write(text.replace(/^error: /, "sandbar: ")),
    })
    .exitOverride();
  if (!colorWanted(process.stdout)) program.configureOutput({ getOutHasColors: () => false, getErrHasColors: () => false });
  authCommands(program);
  sandboxCommands(program);
  execCommands(program);
  shellCommand(program);
  filesCommands(program);
  changesCommand(program);
  snapshotCommands(program);
  volumeCommands(program);
  keyCommands(program);
  serverCommands(program);
  completionCommand(program);
  // Subcommands of subcommands inherit exitOverride and the output settings.
  for (const c of allCommands(program)) c.exitOverride().showSuggestionAfterError().configureOutput(program.configureOutput());
  return program;
}

export function allCommands(cmd: Command): Command[] {
  return cmd.commands.flatMap((c) => [c, ...allCommands(c)]);
}

async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      // --help and --version are successes; a usage mistake is exit 2 (commander printed why).
      return err.exitCode === 0 ? 0 : EXIT.usage;
    }
    throw err;
  }
  return typeof process.exitCode === "number" ? process.exitCode : 0;
}

main(process.argv).then(
  (code) => {
    // `serve` keeps running; everything else ends here even if a connection lingers.
    if (!lifetime.keepAlive) process.stdout.write("", () => process.exit(code));
  },
  (err) => {
    process.stderr.write(`sandbar: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
