import { readFileSync } from "node:fs";

/** A runner process control uses instead of this host (SANDBAR_RUNNER_URL, _CREDENTIAL, _CA). */
export interface RemoteRunnerSettings {
  url: string;
  credential: string;
  /** PEM of the CA that signed the runner's certificate. */
  ca?: string;
}

export function loadRemoteRunnerSettings(env: NodeJS.ProcessEnv): RemoteRunnerSettings | undefined {
  const url = env.SANDBAR_RUNNER_URL || undefined;
  if (!url) return undefined;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`SANDBAR_RUNNER_URL must be an http:// or https:// URL, got "${url}"`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new Error(`SANDBAR_RUNNER_URL must be an http:// or https:// URL, got "${url}"`);
  const credential = env.SANDBAR_RUNNER_CREDENTIAL ?? "";
  if (credential.length < 16) throw new Error("SANDBAR_RUNNER_URL needs SANDBAR_RUNNER_CREDENTIAL (the runner's credential, at least 16 characters)");
  return { url: parsed.origin, credential, ...(env.SANDBAR_RUNNER_CA ? { ca: readFileSync(env.SANDBAR_RUNNER_CA, "utf8") } : {}) };
}

/** How often control asks each registered runner how it is, and how long a silent one stays `ready`. */
export interface RunnerCheckSettings {
  intervalMs: number;
  unresponsiveMs: number;
  /** How long a sandbox on a ready runner may stay unknown to the database before the health loop removes it (default 5 minutes). */
  strayGraceMs?: number;
}

export function loadRunnerCheckSettings(env: NodeJS.ProcessEnv): RunnerCheckSettings {
  const ms = (name: string, fallback: number) => {
    const raw = env[name];
    if (raw === undefined || raw === "") return fallback;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 100) throw new Error(`${name} must be a whole number of milliseconds >= 100, got "${raw}"`);
    return n;
  };
  return { intervalMs: ms("SANDBAR_RUNNER_CHECK_MS", 10_000), unresponsiveMs: ms("SANDBAR_RUNNER_UNRESPONSIVE_MS", 60_000), strayGraceMs: ms("SANDBAR_RUNNER_STRAY_GRACE_MS", 300_000) };
}
