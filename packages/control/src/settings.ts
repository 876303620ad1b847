import { homedir } from "node:os";
import { join } from "node:path";
import { loadObjectStorageSettings, type ObjectStorageSettings } from "./object-storage/settings.ts";
import { loadRateLimitSettings, type RateLimitSettings } from "./limits/settings.ts";
import type { LoginThrottleOptions } from "./identity/login-throttle.ts";
import { parseAddressList, parseTrustedProxies } from "./server/client-address.ts";
import { type ConnectionSettings, loadConnectionSettings } from "./server/connection-limits.ts";
import { loadRegistrySettings, type RegistrySettings } from "./snapshots/settings.ts";
import { type InternalRegistrySettings, loadInternalRegistrySettings } from "./registries/internal/settings.ts";
import { loadRemoteRunnerSettings, loadRunnerCheckSettings, type RemoteRunnerSettings, type RunnerCheckSettings } from "./runners/settings.ts";
import { loadWebhookSettings, type WebhookSettings } from "./webhooks/settings.ts";

/** Server settings, read once from the environment (see docs/configuration.md). */
export interface Settings {
  port: number;
  host: string;
  dataDir: string;
  /** External PostgreSQL; when absent an embedded PostgreSQL runs in `dataDir`. */
  databaseUrl?: string;
  bootstrapApiKey?: string;
  version: string;
  /** The address clients use to reach this server (for URLs the API hands out). */
  publicUrl: string;
  /** Length of one "minute" of the sandbox timers (auto-stop/archive/delete); tests shrink it. */
  timerMinuteMs: number;
  /** How often the sandbox timers run. */
  timerTickMs: number;
  /**
   * Where the default snapshot is built and cached (its `snapshots/` dir goes there); default
   * `<dataDir>/runner`. Tests share one cache so the debootstrap build happens once per machine.
   */
  snapshotCacheDir?: string;
  /**
   * An external OpenID issuer (SANDBAR_OIDC_ISSUER): JWTs are verified against it and the
   * built-in issuer is off. With its client id (for clients signing in) and API audience.
   */
  oidc?: { issuer: string; clientId: string; audience: string };
  /** The bootstrap admin's password for the built-in issuer; generated when unset. */
  bootstrapPassword?: string;
  /**
   * SANDBAR_PRINT_SECRETS=true: the generated admin API key and password are also printed at
   * first start. Off by default: the log names the 0600 files that hold them, not their values.
   */
  printSecrets: boolean;
  /**
   * The login page's throttle (identity/login-throttle.ts): its window, limits and slowdown. Not
   * read from the environment; tests shrink it. Its counters live where the rate limits' do.
   */
  loginThrottle?: Partial<LoginThrottleOptions>;
  /** Sandboxes kept started for creates of the default shape (0: none). */
  warmPool: number;
  /** Most sandboxes an organization's warm pools may keep in all (SANDBAR_WARM_POOL_MAX). */
  warmPoolMax: number;
  /**
   * Encrypts secrets the API stores for later use in clear (OpenTelemetry headers). Unset: a key
   * generated once and kept in the database (protects dumps of the rows, not of the database).
   */
  encryptionKey?: string;
  /**
   * SANDBAR_VOLUME_ROOT: where volume directories live. `serve`: default `<dataDir>/volumes`. A
   * runner mounts volumes only when it is set, to storage shared with control and the region's
   * other runners (an NFS mount, say): a volume is then live between sandboxes on any of them.
   */
  volumeRoot?: string;
  /** The agent run as each sandbox's first process: a bundle directory holding agent.mjs, or one script; default packages/agent/dist. */
  agentBundle?: string;
  /** Proxies whose X-Forwarded-For names the client (addresses or CIDRs); none by default. */
  trustedProxies: string[];
  /** Load balancers (addresses or CIDRs) whose connections start with a PROXY protocol header stating the client (SANDBAR_PROXY_PROTOCOL_FROM); none by default. */
  proxyProtocolFrom: string[];
  /** Caps on open connections and the port's timeouts (SANDBAR_MAX_CONNECTIONS*, SANDBAR_*_TIMEOUT_MS). */
  connections: ConnectionSettings;
  /** Webhook delivery: destinations allowed, retries, timeouts (SANDBAR_WEBHOOK_*). */
  webhooks: WebhookSettings;
  /** Audit entries older than this many days are deleted (SANDBAR_AUDIT_RETENTION_DAYS); unset: kept forever. */
  auditRetentionDays?: number;
  /** Whether toolbox (agent) calls are audited too (SANDBAR_AUDIT_TOOLBOX=true), as the reference's switch. */
  auditToolbox: boolean;
  /**
   * The preview proxy's wildcard domain (SANDBAR_PREVIEW_DOMAIN): `{port}-{sandboxId}.<domain>`
   * reaches a sandbox port. Unset: `preview.<public host>` is served, and the URLs handed out use
   * the path form (which needs no wildcard DNS).
   */
  previewDomain?: string;
  /** Rate limits per counter and window, and where the counters live (SANDBAR_RATE_LIMIT_*). */
  rateLimits: RateLimitSettings;
  /** Where snapshot images are pulled from (SANDBAR_REGISTRY_MIRROR, SANDBAR_INSECURE_REGISTRIES). */
  registries: RegistrySettings;
  /** The registry this server runs for pushes (SANDBAR_INTERNAL_REGISTRY): a loopback address, or off. */
  internalRegistry: InternalRegistrySettings;
  /** Network of creates that ask for none (SANDBAR_SANDBOX_NETWORK): "none" loopback only, "egress" anywhere outside the host. */
  sandboxNetwork: "none" | "egress";
  /** IPv4 range the sandboxes' veth /30s come from (SANDBAR_SANDBOX_SUBNET); default 10.213.0.0/16. */
  sandboxSubnet?: string;
  /** Sandboxes on a runner process instead of this host (SANDBAR_RUNNER_URL, SANDBAR_RUNNER_CREDENTIAL, SANDBAR_RUNNER_CA). */
  remoteRunner?: RemoteRunnerSettings;
  /** Health checks of registered runners (SANDBAR_RUNNER_CHECK_MS, SANDBAR_RUNNER_UNRESPONSIVE_MS). */
  runnerChecks: RunnerCheckSettings;
  /** Build contexts' object storage (SANDBAR_S3_*); no endpoint: the embedded s3rver. */
  objectStorage: ObjectStorageSettings;
  /** What makes sandboxes on this host (SANDBAR_PROVIDER): "linux" (bubblewrap) or "docker" (a Docker engine). */
  sandboxProvider: SandboxProviderSettings;
}

interface SandboxProviderSettings {
  kind: "linux" | "docker";
  /** The Docker engine's API socket (SANDBAR_DOCKER_SOCKET); default /var/run/docker.sock. */
  dockerSocket?: string;
  /** The containers' OCI runtime (SANDBAR_DOCKER_RUNTIME): runc by default, runsc for gVisor. */
  dockerRuntime?: string;
}

function defaultDataDir(env: NodeJS.ProcessEnv = process.env): string {
  // PostgreSQL refuses to run as root and runs as a `postgres` user instead, which cannot
  // enter /root: a root service keeps its data where services do.
  if (process.getuid?.() === 0) return "/var/lib/sandbar";
  return join(env.XDG_DATA_HOME || join(homedir(), ".local", "share"), "sandbar");
}

export function loadSettings(env: NodeJS.ProcessEnv = process.env): Settings {
  const port = env.SANDBAR_PORT === undefined ? 3000 : Number(env.SANDBAR_PORT);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`SANDBAR_PORT must be a port number, got "${env.SANDBAR_PORT}"`);
  }
  const host = env.SANDBAR_HOST || "0.0.0.0";
  return {
    port,
    host,
    dataDir: env.SANDBAR_DATA_DIR || defaultDataDir(env),
    databaseUrl: env.DATABASE_URL || undefined,
    bootstrapApiKey: env.SANDBAR_BOOTSTRAP_API_KEY || undefined,
    version: env.SANDBAR_VERSION || "0.1.0",
    publicUrl: (env.SANDBAR_PUBLIC_URL || `http://localhost:${port}`).replace(/\/+$/, ""),
    timerMinuteMs: positiveInt(env, "SANDBAR_TIMER_MINUTE_MS", 60_000),
    timerTickMs: positiveInt(env, "SANDBAR_TIMER_TICK_MS", 10_000),
    snapshotCacheDir: env.SANDBAR_SNAPSHOT_CACHE || undefined,
    agentBundle: env.SANDBAR_AGENT_BUNDLE || undefined,
    volumeRoot: absolutePath(env, "SANDBAR_VOLUME_ROOT"),
    oidc: oidcSettings(env),
    bootstrapPassword: env.SANDBAR_BOOTSTRAP_PASSWORD || undefined,
    printSecrets: booleanFlag(env, "SANDBAR_PRINT_SECRETS"),
    encryptionKey: env.SANDBAR_ENCRYPTION_KEY || undefined,
    trustedProxies: parseTrustedProxies(env.SANDBAR_TRUSTED_PROXIES),
    proxyProtocolFrom: parseAddressList("SANDBAR_PROXY_PROTOCOL_FROM", env.SANDBAR_PROXY_PROTOCOL_FROM),
    connections: loadConnectionSettings(env),
    webhooks: loadWebhookSettings(env),
    auditRetentionDays: env.SANDBAR_AUDIT_RETENTION_DAYS ? positiveDays(env, "SANDBAR_AUDIT_RETENTION_DAYS") : undefined,
    auditToolbox: booleanFlag(env, "SANDBAR_AUDIT_TOOLBOX"),
    previewDomain: previewDomain(env.SANDBAR_PREVIEW_DOMAIN),
    rateLimits: loadRateLimitSettings(env),
    registries: loadRegistrySettings(env),
    internalRegistry: loadInternalRegistrySettings(env),
    sandboxNetwork: sandboxNetwork(env.SANDBAR_SANDBOX_NETWORK),
    sandboxSubnet: sandboxSubnet(env.SANDBAR_SANDBOX_SUBNET),
    sandboxProvider: sandboxProvider(env),
    objectStorage: loadObjectStorageSettings(env),
    remoteRunner: loadRemoteRunnerSettings(env),
    runnerChecks: loadRunnerCheckSettings(env),
    warmPool: env.SANDBAR_WARM_POOL === undefined || env.SANDBAR_WARM_POOL === "" ? 2 : nonNegativeInt(env, "SANDBAR_WARM_POOL"),
    warmPoolMax: env.SANDBAR_WARM_POOL_MAX === undefined || env.SANDBAR_WARM_POOL_MAX === "" ? 10 : nonNegativeInt(env, "SANDBAR_WARM_POOL_MAX"),
  };
}

function sandboxProvider(env: NodeJS.ProcessEnv): SandboxProviderSettings {
  const kind = (env.SANDBAR_PROVIDER ?? "").trim().toLowerCase() || "linux";
  if (kind !== "linux" && kind !== "docker") throw new Error(`SANDBAR_PROVIDER must be linux or docker, got "${env.SANDBAR_PROVIDER}"`);
  const runtime = env.SANDBAR_DOCKER_RUNTIME?.trim() || undefined;
  if (runtime !== undefined && !/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(runtime)) throw new Error(`SANDBAR_DOCKER_RUNTIME must be a runtime name (runc, runsc), got "${runtime}"`);
  const socket = env.SANDBAR_DOCKER_SOCKET?.trim() || undefined;
  if (socket !== undefined && !socket.startsWith("/")) throw new Error(`SANDBAR_DOCKER_SOCKET must be an absolute path to the engine's unix socket, got "${socket}"`);
  return { kind, ...(socket ? { dockerSocket: socket } : {}), ...(runtime ? { dockerRuntime: runtime } : {}) };
}

function sandboxNetwork(raw: string | undefined): Settings["sandboxNetwork"] {
  const v = (raw ?? "").trim().toLowerCase() || "none";
  if (v !== "none" && v !== "egress") throw new Error(`SANDBAR_SANDBOX_NETWORK must be none or egress, got "${raw}"`);
  return v;
}

function sandboxSubnet(raw: string | undefined): string | undefined {
  if (!raw) return undefined;
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/.exec(raw.trim());
  if (!m || m.slice(1, 5).some((o) => Number(o) > 255) || Number(m[5]) > 24) {
    throw new Error(`SANDBAR_SANDBOX_SUBNET must be an IPv4 CIDR of at least a /24 (e.g. 10.213.0.0/16), got "${raw}"`);
  }
  return raw.trim();
}

function nonNegativeInt(env: NodeJS.ProcessEnv, name: string): number {
  const n = Number(env[name]);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a whole number >= 0, got "${env[name]}"`);
  return n;
}

function positiveDays(env: NodeJS.ProcessEnv, name: string): number {
  const n = Number(env[name]);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a whole number of days >= 1, got "${env[name]}"`);
  return n;
}

function booleanFlag(env: NodeJS.ProcessEnv, name: string): boolean {
  const raw = (env[name] ?? "").trim().toLowerCase();
  if (raw === "" || raw === "false" || raw === "0") return false;
  if (raw === "true" || raw === "1") return true;
  throw new Error(`${name} must be true or false, got "${env[name]}"`);
}

function positiveInt(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer (milliseconds), got "${raw}"`);
  return n;
}

function previewDomain(raw: string | undefined): string | undefined {
  if (!raw) return undefined;
  const domain = raw.toLowerCase().replace(/\.$/, "");
  if (!/^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/.test(domain)) throw new Error(`SANDBAR_PREVIEW_DOMAIN must be a domain name, got "${raw}"`);
  return domain;
}

function oidcSettings(env: NodeJS.ProcessEnv): Settings["oidc"] {
  const issuer = env.SANDBAR_OIDC_ISSUER;
  if (!issuer) return undefined;
  if (!URL.canParse(issuer) || !/^https?:$/.test(new URL(issuer).protocol)) throw new Error(`SANDBAR_OIDC_ISSUER must be an http(s) URL, got "${issuer}"`);
  const audience = env.SANDBAR_OIDC_AUDIENCE;
  if (!audience) throw new Error("SANDBAR_OIDC_AUDIENCE is required with SANDBAR_OIDC_ISSUER (the audience of the API's access tokens)");
  return { issuer, clientId: env.SANDBAR_OIDC_CLIENT_ID || "", audience };
}

function absolutePath(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const v = env[name];
  if (!v) return undefined;
  if (!v.startsWith("/")) throw new Error(`${name} must be an absolute path, got "${v}"`);
  return v;
}
