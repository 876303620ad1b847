import { readConfigFile, writeConfigFile, type ConfigFile, type ConfigProfile, type ResolvedConfig } from "../sdk.ts";

/** The profile a command reads and writes: the one resolved, else the file's active one, else "default". */
export function profileName(config: ResolvedConfig, requested?: string): string {
  return requested ?? config.profile ?? readConfigFile(config.configDir)?.activeProfile ?? "default";
}

/** Changes one profile of the config file (the SDK's format, written 0600) and makes it the active one. */
export async function updateProfile(configDir: string, name: string, change: (p: ConfigProfile) => ConfigProfile): Promise<ConfigProfile> {
  const file: ConfigFile = readConfigFile(configDir) ?? { version: 1, profiles: {} };
  const next = change({ ...(file.profiles[name] ?? {}) });
  for (const k of Object.keys(next) as Array<keyof ConfigProfile>) if (next[k] === undefined) delete next[k];
  file.profiles[name] = next;
  file.activeProfile = name;
  await writeConfigFile(configDir, file);
  return next;
}
