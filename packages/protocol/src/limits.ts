/**
 * Environment variables a client hands a sandbox (on create) or a process (execute, code-run,
 * terminals). They go into every execve of the process tree, where Linux limits one `NAME=value`
 * to 128 KiB (MAX_ARG_STRLEN) and arguments and variables together to a quarter of the stack
 * limit (2 MiB by default; past either, E2BIG): within these, a sandbox's env and a call's fit together.
 */
export const ENV_LIMITS = { count: 256, key: 255, value: 64 * 1024, total: 256 * 1024 };

/** The problems of an env map against ENV_LIMITS, in the words of the other field checks. */
export function envLimitProblems(field: string, env: Record<string, string>): string[] {
  const problems: string[] = [];
  const entries = Object.entries(env);
  if (entries.length > ENV_LIMITS.count) problems.push(`${field} must contain no more than ${ENV_LIMITS.count} elements`);
  let total = 0;
  for (const [k, v] of entries) {
    total += k.length + v.length;
    if (k.length === 0 || k.length > ENV_LIMITS.key) problems.push(`each key in ${field} must be between 1 and ${ENV_LIMITS.key} characters long`);
    if (v.length > ENV_LIMITS.value) problems.push(`${field}.${k.slice(0, 64)} must be shorter than or equal to ${ENV_LIMITS.value} characters`);
  }
  if (total > ENV_LIMITS.total) problems.push(`${field} must be smaller than ${ENV_LIMITS.total} characters in all (keys and values)`);
  return [...new Set(problems)];
}
