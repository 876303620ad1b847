import { readFileSync } from "node:fs";
import { mkdir, rename, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { ConfigurationError } from "./errors.ts";

/** What a client needs to reach the API; every field may come from code, the environment, .env or the config file. */
export interface SandbarOptions {
  /** An API key (`Authorization: Bearer`). */
  apiKey?: string;
  /** A JWT access token (a person signed in); needs `organizationId`. */
  jwtToken?: string;
  /** The API's base URL, ending in `/api` (gRPC is served at the same origin). */
  apiUrl?: string;
  /** Region sandboxes are created in when a create names none. */
  target?: string;
  /** Organization a JWT acts in (`X-Sandbar-Organization-ID`). */
  organizationId?: string;
  /** Where the config file lives; default `SANDBAR_CONFIG_DIR` or the OS user config dir + `/sandbar`. */
  configDir?: string;
  /** Profile of the config file to read; default `SANDBAR_PROFILE`, else the file's active profile. */
  profile?: string;
  /** Environment to read (default `process.env`); tests and tools pass their own. */
  env?: Record<string, string | undefined>;
  /** Directory whose `.env` is read (default `process.cwd()`); `false` reads no `.env`. */
  envFileDir?: string | false;
}

/** A profile as the config file stores it (the CLI writes it; the SDK reads it below the .env file). */
export interface ConfigProfile {
  apiUrl?: string;
  apiKey?: string;
  jwtToken?: string;
  /** OAuth refresh token of a signed-in person, for the CLI to renew `jwtToken`. */
  refreshToken?: string;
  /** When `jwtToken` expires (ISO 8601). */
  tokenExpiresAt?: string;
  organizationId?: string;
  target?: string;
}

/** `<config dir>/config.json`: named profiles and the one in use. */
export interface ConfigFile {
  version: 1;
  activeProfile?: string;
  profiles: Record<string, ConfigProfile>;
}

export const DEFAULT_API_URL = "http://localhost:3000/api";
export const CONFIG_FILE_NAME = "config.json";

/** Where each resolved value came from, highest precedence first. */
export type ConfigSource = "options" | "env" | "dotenv" | "config-file" | "default";

export interface ResolvedConfig {
  apiUrl: string;
  /** The origin and path prefix gRPC calls go to: `apiUrl` without its trailing `/api`. */
  grpcBaseUrl: string;
  apiKey?: string;
  jwtToken?: string;
  organizationId?: string;
  target?: string;
  configDir: string;
  profile?: string;
  sources: Partial<Record<"apiUrl" | "credentials" | "organizationId" | "target", ConfigSource>>;
}

const VARS = {
  apiKey: "SANDBAR_API_KEY",
  jwtToken: "SANDBAR_JWT_TOKEN",
  apiUrl: "SANDBAR_API_URL",
  target: "SANDBAR_TARGET",
  organizationId: "SANDBAR_ORGANIZATION_ID",
} as const;
type Field = keyof typeof VARS;

/** The OS user config directory's `sandbar` folder (XDG on Linux, Application Support on macOS, APPDATA on Windows). */
export function defaultConfigDir(env: Record<string, string | undefined> = process.env, platform: NodeJS.Platform = process.platform, home = homedir()): string {
  if (platform === "win32") return join(env.APPDATA || join(home, "AppData", "Roaming"), "sandbar");
  if (platform === "darwin") return join(home, "Library", "Application Support", "sandbar");
  return join(env.XDG_CONFIG_HOME || join(home, ".config"), "sandbar");
}

/**
 * A .env file's variables. Strict on purpose: a line that is not `KEY=value` (optionally
 * `export `-prefixed, value bare, 'single' or "double" quoted, `#` comments) is an error naming the line,
 * rather than a silently different configuration.
 */
export function parseDotenv(text: string, file = ".env"): Record<string, string> {
  const out: Record<string, string> = {};
  const lines = text.replace(/^\uFEFF/, "").split(/\r?\n/);
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*)$/.exec(line);
    if (!m) throw new ConfigurationError(`${file}:${i + 1}: expected KEY=value`);
    const [, key, rest] = m;
    let value: string;
    if (rest.startsWith('"')) {
      const q = /^"((?:[^"\\]|\\.)*)"\s*(?:#.*)?$/.exec(rest);
      if (!q) throw new ConfigurationError(`${file}:${i + 1}: unterminated double-quoted value of ${key}`);
      value = q[1].replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c === "r" ? "\r" : c === "t" ? "\t" : c));
    } else if (rest.startsWith("'")) {
      const q = /^'([^']*)'\s*(?:#.*)?$/.exec(rest);
      if (!q) throw new ConfigurationError(`${file}:${i + 1}: unterminated single-quoted value of ${key}`);
      value = q[1];
    } else {
      // A bare value ends at a comment that follows whitespace (`a#b` keeps its #).
      value = rest.replace(/\s+#.*$/, "").trim();
    }
    out[key] = value;
  });
  return out;
}

function readOptional(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new ConfigurationError(`cannot read ${path}: ${(err as Error).message}`);
  }
}

/** The config file in `dir`, or undefined when there is none; a malformed one is a ConfigurationError. */
export function readConfigFile(dir: string): ConfigFile | undefined {
  const path = join(dir, CONFIG_FILE_NAME);
  const text = readOptional(path);
  if (text === undefined) return undefined;
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    throw new ConfigurationError(`${path}: not JSON (${(err as Error).message})`);
  }
  return checkConfigFile(data, path);
}

const PROFILE_FIELDS = ["apiUrl", "apiKey", "jwtToken", "refreshToken", "tokenExpiresAt", "organizationId", "target"] as const;

function checkConfigFile(data: unknown, path: string): ConfigFile {
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
  if (!isObject(data)) throw new ConfigurationError(`${path}: expected an object`);
  if (data.version !== 1) throw new ConfigurationError(`${path}: version must be 1`);
  if (data.activeProfile !== undefined && typeof data.activeProfile !== "string") throw new ConfigurationError(`${path}: activeProfile must be a string`);
  if (!isObject(data.profiles)) throw new ConfigurationError(`${path}: profiles must be an object`);
  const profiles: Record<string, ConfigProfile> = {};
  for (const [name, p] of Object.entries(data.profiles)) {
    if (!isObject(p)) throw new ConfigurationError(`${path}: profiles.${name} must be an object`);
    const profile: ConfigProfile = {};
    for (const f of PROFILE_FIELDS) {
      const v = p[f];
      if (v === undefined) continue;
      if (typeof v !== "string") throw new ConfigurationError(`${path}: profiles.${name}.${f} must be a string`);
      profile[f] = v;
    }
    profiles[name] = profile;
  }
  return { version: 1, activeProfile: data.activeProfile as string | undefined, profiles };
}

/** Writes the config file atomically with mode 0600 (it holds tokens), creating the directory 0700. */
export async function writeConfigFile(dir: string, file: ConfigFile): Promise<void> {
  checkConfigFile(file, join(dir, CONFIG_FILE_NAME));
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const path = join(dir, CONFIG_FILE_NAME);
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, JSON.stringify(file, null, 2) + "\n", { mode: 0o600 });
  await rename(tmp, path);
}

/**
 * Updates profile `name` of the config file in `dir` (created with the file when missing): fields
 * given a value are set, fields given `undefined` removed (a sign-out drops its tokens); with
 * `activate` it becomes the active profile. Answers the file as written.
 */
export async function saveProfile(dir: string, name: string, changes: { [K in keyof ConfigProfile]?: string | undefined }, o: { activate?: boolean } = {}): Promise<ConfigFile> {
  const file = readConfigFile(dir) ?? { version: 1, profiles: {} };
  const profile: ConfigProfile = { ...file.profiles[name] };
  for (const [k, v] of Object.entries(changes) as [keyof ConfigProfile, string | undefined][]) {
    if (!PROFILE_FIELDS.includes(k)) throw new ConfigurationError(`unknown profile field ${k}`);
    if (v === undefined) delete profile[k];
    else profile[k] = v;
  }
  const next: ConfigFile = { ...file, profiles: { ...file.profiles, [name]: profile } };
  if (o.activate) next.activeProfile = name;
  await writeConfigFile(dir, next);
  return next;
}

const nonEmpty = (v: string | undefined) => (v === undefined || v === "" ? undefined : v);

/**
 * Resolves a client's configuration, field by field, highest first: options in code, the
 * environment, `.env` in the working directory, the config file's profile, defaults. The credential
 * is one unit: the highest layer naming an API key or a JWT supplies it (an API key wins over a JWT
 * of the same layer), so a key in code is never paired with a token from the config file.
 */
export function resolveConfig(options: SandbarOptions = {}): ResolvedConfig {
  const env = options.env ?? process.env;
  const dotenvDir = options.envFileDir === undefined ? process.cwd() : options.envFileDir;
  const dotenvPath = dotenvDir === false ? undefined : resolve(dotenvDir, ".env");
  const dotenvText = dotenvPath === undefined ? undefined : readOptional(dotenvPath);
  const dotenv = dotenvText === undefined ? {} : parseDotenv(dotenvText, dotenvPath);

  const configDir = nonEmpty(options.configDir) ?? nonEmpty(env.SANDBAR_CONFIG_DIR) ?? nonEmpty(dotenv.SANDBAR_CONFIG_DIR) ?? defaultConfigDir(env);
  const file = readConfigFile(configDir);
  const profileName = nonEmpty(options.profile) ?? nonEmpty(env.SANDBAR_PROFILE) ?? nonEmpty(dotenv.SANDBAR_PROFILE) ?? file?.activeProfile ?? "default";
  const profile = file?.profiles[profileName];
  if (file && !profile && (options.profile || env.SANDBAR_PROFILE || dotenv.SANDBAR_PROFILE)) {
    throw new ConfigurationError(`profile ${profileName} is not in ${join(configDir, CONFIG_FILE_NAME)}`);
  }

  const layers: [ConfigSource, Partial<Record<Field, string | undefined>>][] = [
    ["options", options],
    ["env", Object.fromEntries(Object.entries(VARS).map(([f, v]) => [f, env[v]]))],
    ["dotenv", Object.fromEntries(Object.entries(VARS).map(([f, v]) => [f, dotenv[v]]))],
    ["config-file", profile ?? {}],
  ];
  const pick = (f: Field): [string, ConfigSource] | undefined => {
    for (const [source, layer] of layers) {
      const v = nonEmpty(layer[f]);
      if (v !== undefined) return [v, source];
    }
    return undefined;
  };

  const sources: ResolvedConfig["sources"] = {};
  const [apiUrl, urlSource] = pick("apiUrl") ?? [DEFAULT_API_URL, "default" as const];
  sources.apiUrl = urlSource;
  const grpcBaseUrl = grpcBaseOf(apiUrl);

  let apiKey: string | undefined;
  let jwtToken: string | undefined;
  for (const [source, layer] of layers) {
    apiKey = nonEmpty(layer.apiKey);
    jwtToken = apiKey ? undefined : nonEmpty(layer.jwtToken);
    if (apiKey || jwtToken) {
      sources.credentials = source;
      break;
    }
  }
  const org = pick("organizationId");
  const target = pick("target");
  if (org) sources.organizationId = org[1];
  if (target) sources.target = target[1];
  return { apiUrl, grpcBaseUrl, apiKey, jwtToken, organizationId: org?.[0], target: target?.[0], configDir, profile: profile ? profileName : undefined, sources };
}

function grpcBaseOf(apiUrl: string): string {
  let url: URL;
  try {
    url = new URL(apiUrl);
  } catch {
    throw new ConfigurationError(`apiUrl ${JSON.stringify(apiUrl)} is not a URL (e.g. ${DEFAULT_API_URL})`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new ConfigurationError(`apiUrl must be http or https, got ${url.protocol}`);
  if (url.search || url.hash) throw new ConfigurationError("apiUrl must not carry a query or fragment");
  const path = url.pathname.replace(/\/+$/, "").replace(/\/api$/, "");
  return url.origin + path;
}
