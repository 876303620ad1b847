import { envLimitProblems } from "@sandbar/protocol";
import { readFileSync } from "node:fs";

/**
 * The user's shell, chosen as the reference does: zsh or bash when /etc/shells
 * lists them, else $SHELL, else sh.
 * Synchronous: the agent asks once, before it listens, when nothing else could run meanwhile
 * (an asynchronous read is four round trips through the thread pool on its start's critical path).
 */
export function detectShell(env: NodeJS.ProcessEnv): string {
  let listed: string[] = [];
  try {
    listed = readFileSync("/etc/shells", "utf8")
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => l !== "" && !l.startsWith("#"));
  } catch {
    // No /etc/shells: fall through to $SHELL.
  }
  for (const preferred of ["/usr/bin/zsh", "/bin/zsh", "/usr/bin/bash", "/bin/bash"]) {
    if (listed.includes(preferred)) return preferred;
  }
  return env.SHELL || "/bin/sh";
}

/** Quotes a string for any POSIX shell. */
export function shellQuote(s: string): string {
  return `'${s.replaceAll("'", `'\\''`)}'`;
}

const envName = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Checks a call's environment variables: valid names, within ENV_LIMITS (past the kernel's
 * limits the process would not start: E2BIG); returns an error text or undefined.
 */
export function envProblem(envs: Record<string, string>): string | undefined {
  for (const k of Object.keys(envs)) {
    if (!envName.test(k)) return `invalid environment variable name: ${JSON.stringify(k)}`;
  }
  const problems = envLimitProblems("envs", envs);
  return problems.length ? problems.join(", ") : undefined;
}
