import type { Command } from "commander";
import { configOf } from "./context.ts";
import type { GlobalOptions } from "./global-options.ts";
import { CliError, explain } from "./failure.ts";

/** `serve` runs until a signal; every other command ends the process when its action returns. */
export const lifetime = { keepAlive: false };

/** Set by a command whose exit status is not just success or failure (`exec` passes its command's through). */
export class ExitCode {
  readonly code: number;
  constructor(code: number) {
    this.code = code;
  }
}

type Result = Promise<void | ExitCode>;
type Action = (...args: unknown[]) => Promise<void>;

/**
 * A commander action with the CLI's one failure path: any error becomes one line on stderr
 * saying what to do next and exit code 1 (the stack trace only with --debug). The body gets
 * commander's arguments (positionals, then the command's options) and the global options.
 */
export function run<O>(body: (opts: O, globals: GlobalOptions) => Result): Action;
export function run<A, O>(body: (a: A, opts: O, globals: GlobalOptions) => Result): Action;
export function run<A, B, O>(body: (a: A, b: B, opts: O, globals: GlobalOptions) => Result): Action;
export function run<A, B, C, O>(body: (a: A, b: B, c: C, opts: O, globals: GlobalOptions) => Result): Action;
export function run(body: (...args: never[]) => Result): Action {
  return async (...args: unknown[]) => {
    const command = args.at(-1) as Command;
    const globals = command.optsWithGlobals() as GlobalOptions;
    try {
      const result = await (body as (...a: unknown[]) => Result)(...args.slice(0, -1), globals);
      process.exitCode = result instanceof ExitCode ? result.code : 0;
    } catch (err) {
      reportFailure(err, globals);
      process.exitCode = err instanceof CliError ? err.exitCode : 1;
    }
  };
}

function reportFailure(err: unknown, globals: GlobalOptions): void {
  let server: string | undefined;
  try {
    server = configOf(globals).apiUrl;
  } catch {
    server = undefined;
  }
  const line = explain(err, server);
  process.stderr.write(`sandbar: ${line}\n`);
  if (globals.debug) process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n${causeChain(err)}`);
}

function causeChain(err: unknown): string {
  let text = "";
  for (let e = (err as { cause?: unknown })?.cause, depth = 0; e && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    text += `caused by: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`;
  }
  return text;
}
