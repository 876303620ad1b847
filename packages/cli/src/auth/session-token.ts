import { readConfigFile, resolveConfig, type ResolvedConfig } from "../sdk.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { discover, serverOidc, tokenRequest } from "./oidc.ts";
import { profileName, updateProfile } from "./profiles.ts";

/** A token this close to its expiry is refreshed before use, so a call does not die halfway. */
const EARLY_MS = 60_000;

/**
 * The signed-in person's access token from the config file, refreshed with the stored refresh
 * token when it has expired (refresh tokens rotate: the new one is saved at once).
 */
export async function ensureFreshToken(config: ResolvedConfig, globals: GlobalOptions, now = Date.now()): Promise<ResolvedConfig> {
  const name = profileName(config, globals.profile);
  const profile = readConfigFile(config.configDir)?.profiles[name];
  // Another sandbar process refreshed (and so spent our refresh token): take what it saved.
  if (profile?.jwtToken && config.sources.credentials === "config-file" && profile.jwtToken !== config.jwtToken) config = resolveConfig({ profile: globals.profile, apiUrl: globals.apiUrl });
  if (!profile?.jwtToken || profile.jwtToken !== config.jwtToken) return config;
  const expires = profile.tokenExpiresAt ? Date.parse(profile.tokenExpiresAt) : NaN;
  if (!Number.isFinite(expires) || expires - now > EARLY_MS) return config;
  if (!profile.refreshToken) throw new CliError("Your sign-in has expired: run `sandbar login`.");
  const { issuer, clientId } = await serverOidc(config.apiUrl);
  const { token_endpoint } = await discover(issuer);
  const tokens = await tokenRequest(token_endpoint, { grant_type: "refresh_token", refresh_token: profile.refreshToken, client_id: clientId }).catch(async (err) => {
    // A refused refresh token is dead: forget it so the next command says "log in" at once.
    await updateProfile(config.configDir, name, { jwtToken: undefined, refreshToken: undefined, tokenExpiresAt: undefined });
    throw err;
  });
  await updateProfile(config.configDir, name, { ...tokenFields(tokens, now) });
  return resolveConfig({ profile: globals.profile, apiUrl: globals.apiUrl });
}

export function tokenFields(tokens: { access_token: string; refresh_token?: string; expires_in?: number }, now = Date.now()) {
  return {
    jwtToken: tokens.access_token,
    refreshToken: tokens.refresh_token,
    tokenExpiresAt: new Date(now + (tokens.expires_in ?? 3600) * 1000).toISOString(),
  };
}

/**
 * For the SDK's tokenProvider: the token of a sign-in saved in the config file, refreshed when it
 * nears expiry during a long command (shell, logs -f); one refresh at a time.
 */
export function refreshingToken(config: ResolvedConfig, globals: GlobalOptions): (() => Promise<string>) | undefined {
  if (!config.jwtToken || config.apiKey || config.sources.credentials !== "config-file") return undefined;
  let current = config;
  let pending: Promise<ResolvedConfig> | undefined;
  return async () => {
    pending ??= ensureFreshToken(current, globals).finally(() => (pending = undefined));
    current = await pending;
    return current.jwtToken ?? "";
  };
}
