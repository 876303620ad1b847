import type { Command } from "commander";
import { configOf, type GlobalOptions } from "./context.ts";
import { CliError, explain } from "./failure.ts";

/** Set by a command whose exit status is not just success or failure (`exec` passes its command's through). */
export class ExitCode {
  constructor(readonly code: number) {}
}

/**
 * A commander action with the CLI's one failure path: any error becomes one line on stderr
 * saying what to do next and exit code 1 (the stack trace only with --debug).
 */
export function run<A extends unknown[]>(body: (...args: [...A, GlobalOptions]) => Promise<void | ExitCode>): (...args: unknown[]) => Promise<void> {
  return async (...args: unknown[]) => {
    const command = args.at(-1) as Command;
    const globals = command.optsWithGlobals() as GlobalOptions;
    const own = args.slice(0, -1) as unknown as A;
    try {
      const result = await body(...own, globals);
      process.exitCode = result instanceof ExitCode ? result.code : 0;
    } catch (err) {
      reportFailure(err, globals);
      process.exitCode = err instanceof CliError ? err.exitCode : 1;
    }
  };
}

export function reportFailure(err: unknown, globals: GlobalOptions): void {
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
