import type { DescService } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { resolveConfig, type ResolvedConfig } from "./sdk.ts";
import { cliClients } from "./transport.ts";
import { CliError } from "./failure.ts";
import { makeOutput, type Output } from "./output.ts";
import { ensureFreshToken, refreshingToken } from "./auth/session-token.ts";
import type { GlobalOptions } from "./global-options.ts";


/** What a command works with: its output, the resolved configuration and clients through the SDK's transport. */
export interface Context {
  out: Output;
  config: ResolvedConfig;
  /** A client of a control service, or of a sandbox's toolbox service when `sandboxId` is given. */
  client<S extends DescService>(service: S, sandboxId?: string): Client<S>;
}

/** Configuration only (no credentials needed): for login and the commands that manage the config file. */
export function configOf(globals: GlobalOptions): ResolvedConfig {
  return resolveConfig({ profile: globals.profile, apiUrl: globals.apiUrl });
}

/**
 * A context whose calls are authenticated: the credentials must exist, a signed-in person's
 * token is refreshed first when it has expired (or is about to). A person's calls need an
 * organization, except the user-level ones (`needsOrganization: false`: whoami, org list).
 */
export async function openContext(globals: GlobalOptions, opts: { needsOrganization?: boolean } = {}): Promise<Context> {
  let config = configOf(globals);
  if (!config.apiKey && !config.jwtToken) {
    throw new CliError(`Not signed in to ${config.apiUrl}: run \`sandbar login\` (or \`sandbar login --api-key KEY\`), or set SANDBAR_API_KEY.`);
  }
  if (config.jwtToken && config.sources.credentials === "config-file") config = await ensureFreshToken(config, globals);
  if (config.jwtToken && !config.organizationId && opts.needsOrganization !== false) {
    throw new CliError("No organization chosen for your sign-in: run `sandbar org list`, then `sandbar org use ID`.");
  }
  return contextFor(config, globals);
}

export function contextFor(config: ResolvedConfig, globals: GlobalOptions): Context {
  const out = makeOutput({ json: Boolean(globals.json) });
  // A pause for a retry is explained to a person watching (or with --debug); a script's stderr keeps its one line.
  const note = (line: string) => {
    if (process.stderr.isTTY || globals.debug) process.stderr.write(line + "\n");
  };
  return { out, config, client: cliClients(config, note, refreshingToken(config, globals)) };
}
