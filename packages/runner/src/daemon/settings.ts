import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { type Gpus, loadGpus } from "./gpus.ts";

/** A `sandbar runner` process's own settings (SANDBAR_RUNNER_*), beside the common ones (data dir, agent, subnet). */
export interface RunnerHostSettings {
  host: string;
  port: number;
  /** What control must present (SANDBAR_RUNNER_CREDENTIAL): the credential control handed out for this runner. */
  credential?: string;
  /** Or: the runner registers itself at its first start (register.ts). */
  registration?: RunnerRegistration;
  /** PEM certificate chain and key (SANDBAR_RUNNER_TLS_CERT, SANDBAR_RUNNER_TLS_KEY: file paths): TLS instead of h2c. */
  tls?: { cert: string; key: string };
  /** What the runner offers sandboxes (SANDBAR_RUNNER_CPU, SANDBAR_RUNNER_MEMORY_GIB, SANDBAR_RUNNER_DISK_GIB); default the host's. */
  capacity: { cpu?: number; memoryGiB?: number; diskGiB?: number };
  /** Its GPUs (SANDBAR_RUNNER_GPU, SANDBAR_RUNNER_GPU_TYPE; default the host's NVIDIA devices): it then takes only GPU sandboxes. */
  gpus: Gpus;
}

export function loadRunnerHostSettings(env: NodeJS.ProcessEnv = process.env): RunnerHostSettings {
  const port = env.SANDBAR_RUNNER_PORT === undefined || env.SANDBAR_RUNNER_PORT === "" ? 3100 : Number(env.SANDBAR_RUNNER_PORT);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`SANDBAR_RUNNER_PORT must be a port number, got "${env.SANDBAR_RUNNER_PORT}"`);
  const credential = env.SANDBAR_RUNNER_CREDENTIAL || undefined;
  if (credential !== undefined && credential.length < 16) throw new Error("SANDBAR_RUNNER_CREDENTIAL must be the runner's credential (at least 16 characters)");
  const registration = loadRegistration(env, port, !!env.SANDBAR_RUNNER_TLS_CERT);
  if (!credential && !registration) {
    throw new Error("a runner needs SANDBAR_RUNNER_CREDENTIAL (from POST /runners), or SANDBAR_CONTROL_URL, SANDBAR_RUNNER_REGISTRATION_KEY and SANDBAR_RUNNER_REGION to register itself");
  }
  const certFile = env.SANDBAR_RUNNER_TLS_CERT || undefined;
  const keyFile = env.SANDBAR_RUNNER_TLS_KEY || undefined;
  if (!certFile !== !keyFile) throw new Error("SANDBAR_RUNNER_TLS_CERT and SANDBAR_RUNNER_TLS_KEY go together");
  const size = (name: string): number | undefined => {
    const raw = env[name];
    if (raw === undefined || raw === "") return undefined;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a whole number >= 1, got "${raw}"`);
    return n;
  };
  return {
    capacity: { cpu: size("SANDBAR_RUNNER_CPU"), memoryGiB: size("SANDBAR_RUNNER_MEMORY_GIB"), diskGiB: size("SANDBAR_RUNNER_DISK_GIB") },
    gpus: loadGpus(env),
    host: env.SANDBAR_RUNNER_HOST || "0.0.0.0",
    port,
    ...(credential ? { credential } : {}),
    ...(registration ? { registration } : {}),
    ...(certFile && keyFile ? { tls: { cert: readFileSync(certFile, "utf8"), key: readFileSync(keyFile, "utf8") } } : {}),
  };
}

/** How a runner registers itself: control's URL, an API key with write:runners, its region and name, and the URL control reaches it at. */
interface RunnerRegistration {
  controlUrl: string;
  key: string;
  region: string;
  name: string;
  advertiseUrl: string;
}

function loadRegistration(env: NodeJS.ProcessEnv, port: number, tls: boolean): RunnerRegistration | undefined {
  const controlUrl = env.SANDBAR_CONTROL_URL || undefined;
  if (!controlUrl) return undefined;
  const url = (name: string, raw: string) => {
    try {
      const u = new URL(raw);
      if (u.protocol === "http:" || u.protocol === "https:") return u.origin;
    } catch {
      // refused below
    }
    throw new Error(`${name} must be an http:// or https:// URL, got "${raw}"`);
  };
  const key = env.SANDBAR_RUNNER_REGISTRATION_KEY ?? "";
  const region = env.SANDBAR_RUNNER_REGION ?? "";
  if (!key || !region) throw new Error("SANDBAR_CONTROL_URL needs SANDBAR_RUNNER_REGISTRATION_KEY (an API key with write:runners) and SANDBAR_RUNNER_REGION");
  const host = hostname();
  return {
    controlUrl: url("SANDBAR_CONTROL_URL", controlUrl),
    key,
    region,
    name: env.SANDBAR_RUNNER_NAME || host,
    advertiseUrl: url("SANDBAR_RUNNER_ADVERTISE_URL", env.SANDBAR_RUNNER_ADVERTISE_URL || `${tls ? "https" : "http"}://${host}:${port}`),
  };
}
