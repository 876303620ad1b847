import { Code } from "@connectrpc/connect";
import { asConnectError, errors } from "@sandbar/protocol";
import { ExecuteRequestSchema, ProcessService } from "@sandbar/protocol/gen/sandbar/agent/v1/process_pb.js";
import { DecodeErrors, readJsonMessage, sendJson } from "./http.ts";
import type { RestHandler } from "./routes.ts";
import { outputMode } from "./sdk-version.ts";

/**
 * `POST …/process/execute` → `{exitCode, result}`; past the timeout 408 "command execution timeout".
 * SDKs before 0.158 send `sh -c "<exports> echo '<base64>' | base64 -d | sh"`, which the reference
 * daemon split into words (quotes honoured, no escapes) and exec'd without a shell, so the `$(…)`
 * inside the double quotes ran in the inner sh. The agent runs commands as shell scripts, where the
 * outer shell would expand them first and re-parse env values holding quotes or `$`; so that form
 * is passed as the exact argv, each word single-quoted.
 */
export const execute: RestHandler = async ({ req, res, caller }) => {
  const errs = new DecodeErrors();
  const input = await readJsonMessage(req, ExecuteRequestSchema, errs);
  if (outputMode(req.headers).legacyExecute) input.command = legacyWrapped(input.command) ?? input.command;
  try {
    const out = await caller.unary(ProcessService.method.execute, input, errs.messages);
    sendJson(res, 200, { exitCode: out.exitCode, result: out.result });
  } catch (err) {
    if (asConnectError(err).code === Code.DeadlineExceeded) throw errors.deadlineExceeded("command execution timeout");
    throw err;
  }
};

/** The argv of a legacy `sh -c "…"` command as a shell command line; undefined for other commands. */
export function legacyWrapped(command: string): string | undefined {
  if (!command.trimStart().startsWith('sh -c "')) return undefined;
  const argv = splitWords(command);
  if (argv.length !== 3 || argv[0] !== "sh" || argv[1] !== "-c") return undefined;
  return argv.map(shellQuote).join(" ");
}

/** Splits on spaces outside quotes; `'` and `"` quote (no escapes), as the reference daemon did. */
export function splitWords(command: string): string[] {
  const words: string[] = [];
  let word = "";
  let inWord = false;
  let quote: string | undefined;
  for (const ch of command) {
    if (quote) {
      if (ch === quote) quote = undefined;
      else word += ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      inWord = true;
    } else if (ch === " ") {
      if (inWord) words.push(word);
      word = "";
      inWord = false;
    } else {
      word += ch;
      inWord = true;
    }
  }
  if (inWord) words.push(word);
  return words;
}

function shellQuote(s: string): string {
  return `'${s.replaceAll("'", `'\\''`)}'`;
}
