import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { DEFAULT_API_URL, defaultConfigDir, parseDotenv, readConfigFile, resolveConfig, saveProfile, writeConfigFile, type ConfigSource } from "./config.ts";
import { ConfigurationError } from "./errors.ts";

// The precedence matrix on real files: a .env in a temporary working directory and a config
// file in a temporary config directory; the environment is passed in rather than mutated.

let dir: string;
let cwd: string;
let configDir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "sandbar-sdk-config-"));
  cwd = join(dir, "cwd");
  configDir = join(dir, "config");
  await writeConfigFile(cwd, { version: 1, profiles: {} }); // creates the directory
  await rm(join(cwd, "config.json"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

const LAYERS = ["options", "env", "dotenv", "config-file"] as const satisfies readonly ConfigSource[];
const FIELDS = {
  apiUrl: ["SANDBAR_API_URL", (layer: string) => `http://${layer}.example:3000/api`],
  target: ["SANDBAR_TARGET", (layer: string) => `region-${layer}`],
  organizationId: ["SANDBAR_ORGANIZATION_ID", (layer: string) => `org-${layer}`],
  apiKey: ["SANDBAR_API_KEY", (layer: string) => `key-${layer}`],
} as const;

/** Every non-empty subset of the layers. */
const subsets = Array.from({ length: 2 ** LAYERS.length - 1 }, (_, i) => LAYERS.filter((_, b) => (i + 1) & (1 << b)));

async function setUp(present: readonly string[]) {
  const options: Record<string, string> = {};
  const env: Record<string, string> = {};
  const dotenv: string[] = ["# a comment", ""];
  const profile: Record<string, string> = {};
  for (const [field, [variable, value]] of Object.entries(FIELDS)) {
    if (present.includes("options")) options[field] = value("options");
    if (present.includes("env")) env[variable] = value("env");
    if (present.includes("dotenv")) dotenv.push(`${variable}=${value("dotenv")}`);
    if (present.includes("config-file")) profile[field] = value("config-file");
  }
  await writeFile(join(cwd, ".env"), dotenv.join("\n"));
  await writeConfigFile(configDir, { version: 1, activeProfile: "work", profiles: { work: profile } });
  return resolveConfig({ ...options, env, envFileDir: cwd, configDir });
}

describe("configuration precedence: options > env > .env > config file > defaults", () => {
  it.each(subsets.map((s) => [s.join(" + "), s] as const))("with %s, each field comes from the highest layer", async (_, present) => {
    const c = await setUp(present);
    const top = present[0];
    expect(c.apiUrl).toBe(FIELDS.apiUrl[1](top));
    expect(c.grpcBaseUrl).toBe(`http://${top}.example:3000`);
    expect(c.target).toBe(`region-${top}`);
    expect(c.organizationId).toBe(`org-${top}`);
    expect(c.apiKey).toBe(`key-${top}`);
    expect(c.sources).toEqual({ apiUrl: top, credentials: top, organizationId: top, target: top });
  });

  it("with nothing anywhere, the defaults (and no credential)", () => {
    const c = resolveConfig({ env: {}, envFileDir: cwd, configDir });
    expect(c).toMatchObject({ apiUrl: DEFAULT_API_URL, grpcBaseUrl: "http://localhost:3000", apiKey: undefined, jwtToken: undefined, target: undefined });
    expect(c.sources).toEqual({ apiUrl: "default" });
  });

  it("resolves each field on its own: a URL from .env, a key from the environment, a target from the config file", async () => {
    await writeFile(join(cwd, ".env"), "SANDBAR_API_URL=https://sandbar.internal/api\n");
    await writeConfigFile(configDir, { version: 1, profiles: { default: { target: "eu", apiUrl: "http://ignored/api" } } });
    const c = resolveConfig({ env: { SANDBAR_API_KEY: "from-env" }, envFileDir: cwd, configDir });
    expect(c).toMatchObject({ apiUrl: "https://sandbar.internal/api", grpcBaseUrl: "https://sandbar.internal", apiKey: "from-env", target: "eu" });
    expect(c.sources).toEqual({ apiUrl: "dotenv", credentials: "env", target: "config-file" });
  });

  it("takes the credential as a unit: a JWT in the environment beats an API key in the config file", async () => {
    await writeConfigFile(configDir, { version: 1, profiles: { default: { apiKey: "file-key", organizationId: "org-file" } } });
    const c = resolveConfig({ env: { SANDBAR_JWT_TOKEN: "jwt-env" }, envFileDir: cwd, configDir });
    expect(c.apiKey).toBeUndefined();
    expect(c.jwtToken).toBe("jwt-env");
    expect(c.organizationId).toBe("org-file");
    // Within one layer the API key wins.
    const both = resolveConfig({ apiKey: "k", jwtToken: "j", env: {}, envFileDir: cwd, configDir });
    expect([both.apiKey, both.jwtToken]).toEqual(["k", undefined]);
  });

  it("treats empty values as unset", async () => {
    await writeFile(join(cwd, ".env"), "SANDBAR_API_KEY=dotenv-key\n");
    const c = resolveConfig({ apiKey: "", env: { SANDBAR_API_KEY: "" }, envFileDir: cwd, configDir });
    expect(c.apiKey).toBe("dotenv-key");
  });

  it("reads no .env when envFileDir is false", async () => {
    await writeFile(join(cwd, ".env"), "SANDBAR_API_KEY=dotenv-key\n");
    expect(resolveConfig({ env: {}, envFileDir: false, configDir }).apiKey).toBeUndefined();
  });
});

describe("config directory and profiles", () => {
  it("comes from options, then SANDBAR_CONFIG_DIR, then .env, then the OS user config dir", async () => {
    await writeConfigFile(configDir, { version: 1, profiles: { default: { apiKey: "in-config-dir" } } });
    expect(resolveConfig({ env: { SANDBAR_CONFIG_DIR: configDir }, envFileDir: cwd }).apiKey).toBe("in-config-dir");
    await writeFile(join(cwd, ".env"), `SANDBAR_CONFIG_DIR=${configDir}\n`);
    const fromDotenv = resolveConfig({ env: { XDG_CONFIG_HOME: join(dir, "nowhere") }, envFileDir: cwd });
    expect(fromDotenv).toMatchObject({ apiKey: "in-config-dir", configDir });
    expect(resolveConfig({ configDir: join(dir, "other"), env: { SANDBAR_CONFIG_DIR: configDir }, envFileDir: false }).apiKey).toBeUndefined();
    expect(resolveConfig({ env: { XDG_CONFIG_HOME: join(dir, "xdg") }, envFileDir: false }).configDir).toBe(join(dir, "xdg", "sandbar"));
  });

  it("follows each OS's convention", () => {
    expect(defaultConfigDir({ XDG_CONFIG_HOME: "/x" }, "linux", "/home/u")).toBe("/x/sandbar");
    expect(defaultConfigDir({}, "linux", "/home/u")).toBe("/home/u/.config/sandbar");
    expect(defaultConfigDir({}, "darwin", "/Users/u")).toBe("/Users/u/Library/Application Support/sandbar");
    expect(defaultConfigDir({ APPDATA: "C:\\Users\\u\\AppData\\Roaming" }, "win32", "C:\\Users\\u")).toMatch(/Roaming.sandbar$/);
  });

  it("reads the active profile, or the one named by option or SANDBAR_PROFILE", async () => {
    await writeConfigFile(configDir, { version: 1, activeProfile: "a", profiles: { a: { apiKey: "ka" }, b: { apiKey: "kb" } } });
    expect(resolveConfig({ env: {}, envFileDir: false, configDir })).toMatchObject({ apiKey: "ka", profile: "a" });
    expect(resolveConfig({ env: { SANDBAR_PROFILE: "b" }, envFileDir: false, configDir }).apiKey).toBe("kb");
    expect(resolveConfig({ profile: "a", env: { SANDBAR_PROFILE: "b" }, envFileDir: false, configDir }).apiKey).toBe("ka");
    expect(() => resolveConfig({ profile: "c", env: {}, envFileDir: false, configDir })).toThrow(/profile c is not in/);
  });

  it("writes the file 0600 in a 0700 directory and reads back what it wrote", async () => {
    const file = { version: 1 as const, activeProfile: "me", profiles: { me: { apiUrl: "http://h/api", jwtToken: "j", refreshToken: "r", tokenExpiresAt: "2026-01-01T00:00:00Z", organizationId: "o" } } };
    await writeConfigFile(configDir, file);
    expect(readConfigFile(configDir)).toEqual(file);
    expect((await stat(join(configDir, "config.json"))).mode & 0o777).toBe(0o600);
    expect((await stat(configDir)).mode & 0o777).toBe(0o700);
  });

  it("saveProfile sets and removes fields of one profile, creating the file, and can make it active", async () => {
    await saveProfile(configDir, "work", { apiUrl: "https://w/api", jwtToken: "j1", refreshToken: "r1" }, { activate: true });
    await saveProfile(configDir, "home", { apiKey: "k" });
    expect(resolveConfig({ env: {}, envFileDir: false, configDir })).toMatchObject({ profile: "work", apiUrl: "https://w/api", jwtToken: "j1" });
    // Signing out of "work": its tokens go, its URL stays; "home" is untouched.
    const file = await saveProfile(configDir, "work", { jwtToken: undefined, refreshToken: undefined });
    expect(file).toEqual({ version: 1, activeProfile: "work", profiles: { work: { apiUrl: "https://w/api" }, home: { apiKey: "k" } } });
    expect(readConfigFile(configDir)).toEqual(file);
    // Reflect.apply passes the field the types refuse, as an untyped caller may.
    await expect(Reflect.apply(saveProfile, undefined, [configDir, "work", { password: "x" }])).rejects.toThrow(/unknown profile field password/);
  });

  it("refuses a malformed config file with the path and the field", async () => {
    const path = join(configDir, "config.json");
    await writeConfigFile(configDir, { version: 1, profiles: {} });
    await writeFile(path, "{not json");
    expect(() => resolveConfig({ env: {}, envFileDir: false, configDir })).toThrow(ConfigurationError);
    await writeFile(path, JSON.stringify({ version: 2, profiles: {} }));
    expect(() => readConfigFile(configDir)).toThrow(/version must be 1/);
    await writeFile(path, JSON.stringify({ version: 1, profiles: { x: { apiKey: 5 } } }));
    expect(() => readConfigFile(configDir)).toThrow(/profiles\.x\.apiKey must be a string/);
    expect(await readFile(path, "utf8")).toContain("apiKey");
  });
});

describe(".env parsing", () => {
  it("reads bare, quoted and exported values and comments", () => {
    const text = ['export A=1', 'B = "two words" # trailing', "C='it''", "C2='single # kept'", 'D="line\\nbreak \\"q\\""', "E=a#b", "F=x # gone", "", "# G=no"].join("\n");
    expect(() => parseDotenv(text)).toThrow(/\.env:3: unterminated single-quoted value of C/);
    const ok = text.replace("C='it''", "C=it");
    expect(parseDotenv(ok)).toEqual({ A: "1", B: "two words", C: "it", C2: "single # kept", D: 'line\nbreak "q"', E: "a#b", F: "x" });
  });

  it("refuses a line that is not KEY=value, naming the line", () => {
    expect(() => parseDotenv("A=1\nnot a pair\n", "/p/.env")).toThrow("/p/.env:2: expected KEY=value");
    expect(() => parseDotenv('A="open')).toThrow(/unterminated double-quoted/);
  });

  it("makes a bad .env or URL a ConfigurationError of resolveConfig", async () => {
    await writeFile(join(cwd, ".env"), "SANDBAR_API_URL\n");
    expect(() => resolveConfig({ env: {}, envFileDir: cwd, configDir })).toThrow(ConfigurationError);
    expect(() => resolveConfig({ apiUrl: "localhost:3000", env: {}, envFileDir: false, configDir })).toThrow(/not a URL|must be http/);
    expect(() => resolveConfig({ apiUrl: "ftp://h/api", env: {}, envFileDir: false, configDir })).toThrow(/must be http or https/);
    expect(resolveConfig({ apiUrl: "https://h/prefix/api/", env: {}, envFileDir: false, configDir }).grpcBaseUrl).toBe("https://h/prefix");
  });
});
