import { readConfigFile, saveProfile, type ConfigProfile, type ResolvedConfig } from "../sdk.ts";

/** The profile a command reads and writes: the one resolved, else the file's active one, else "default". */
export function profileName(config: ResolvedConfig, requested?: string): string {
  return requested ?? config.profile ?? readConfigFile(config.configDir)?.activeProfile ?? "default";
}

/** Sets (or, given undefined, drops) fields of one profile through the SDK's writer (0600) and makes it the active one. */
export async function updateProfile(configDir: string, name: string, changes: { [K in keyof ConfigProfile]?: string | undefined }): Promise<void> {
  await saveProfile(configDir, name, changes, { activate: true });
}
