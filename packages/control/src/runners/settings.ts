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
