import { randomBytes } from "node:crypto";
import { spawn } from "node:child_process";
import type { Command } from "commander";
import { readConfigFile, resolveConfig } from "../sdk.ts";
import { Permission } from "@sandbar/protocol/gen/sandbar/control/v1/permission_pb.js";
import { ApiKeyService } from "@sandbar/protocol/gen/sandbar/control/v1/api_key_pb.js";
import { OrganizationService, type Organization } from "@sandbar/protocol/gen/sandbar/control/v1/organization_pb.js";
import { UserService } from "@sandbar/protocol/gen/sandbar/control/v1/user_pb.js";
import { configOf, contextFor, openContext } from "../context.ts";
import type { GlobalOptions } from "../global-options.ts";
import { CliError } from "../failure.ts";
import { makeOutput } from "../output.ts";
import { discover, loopbackRedirect, pkce, serverOidc, tokenRequest } from "../auth/oidc.ts";
import { profileName, updateProfile } from "../auth/profiles.ts";
import { tokenFields } from "../auth/session-token.ts";
import { run } from "../run.ts";

/** How long `login` waits for the browser to come back. */
const LOGIN_TIMEOUT_MS = 5 * 60_000;

export function authCommands(program: Command): void {
  program
    .command("login")
    .description("sign in through the browser (OpenID Connect with PKCE), or save an API key")
    .option("--api-key <key>", "save this API key instead of signing in through the browser")
    .option("--no-browser", "print the sign-in URL without opening a browser")
    .addHelpText("after", "\nThe credentials go into the profile of <config dir>/config.json (mode 0600): SANDBAR_CONFIG_DIR, or ~/.config/sandbar.")
    .action(run(async (opts: { apiKey?: string; browser: boolean }, globals: GlobalOptions) => login(globals, opts)));

  program
    .command("logout")
    .description("forget the saved credentials of this profile (and revoke a browser sign-in)")
    .action(run(async (_opts: unknown, globals: GlobalOptions) => logout(globals)));

  program
    .command("whoami")
    .description("who the saved or configured credentials act as")
    .action(
      run(async (_opts: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals, { needsOrganization: false });
        if (ctx.config.apiKey) {
          const key = await ctx.client(ApiKeyService).getCurrentApiKey({});
          const orgs = await ctx.client(OrganizationService).listOrganizations({});
          const info = { kind: "api-key", apiUrl: ctx.config.apiUrl, keyName: key.name, userId: key.userId, organizationId: orgs.items[0]?.id, organization: orgs.items[0]?.name, permissions: key.permissions.map(permissionName) };
          ctx.out.result(info, () => {
            console.log(`API key ${ctx.out.paint("bold", key.name)} of user ${key.userId} at ${ctx.config.apiUrl}`);
            console.log(`organization: ${info.organization ?? "?"} (${info.organizationId ?? "?"})`);
            console.log(`permissions: ${info.permissions.join(", ") || "none"}`);
          });
        } else {
          const user = await ctx.client(UserService).getAuthenticatedUser({});
          const orgs = await ctx.client(OrganizationService).listOrganizations({});
          const org = orgs.items.find((o) => o.id === ctx.config.organizationId);
          const info = { kind: "user", apiUrl: ctx.config.apiUrl, userId: user.id, name: user.name, email: user.email, organizationId: ctx.config.organizationId, organization: org?.name };
          ctx.out.result(info, () => {
            console.log(`${ctx.out.paint("bold", user.name || user.id)} <${user.email}> at ${ctx.config.apiUrl}`);
            console.log(`organization: ${org?.name ?? "?"} (${ctx.config.organizationId})`);
          });
        }
      }),
    );

  const org = program.command("org").description("organizations you belong to");
  org
    .command("list")
    .description("list your organizations (* marks the one in use)")
    .action(
      run(async (_opts: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals, { needsOrganization: false });
        const { items } = await ctx.client(OrganizationService).listOrganizations({});
        const current = ctx.config.apiKey ? items[0]?.id : ctx.config.organizationId;
        ctx.out.result(
          items.map((o) => ({ id: o.id, name: o.name, personal: o.personal, current: o.id === current })),
          () => ctx.out.table(items.map((o) => ({ " ": o.id === current ? "*" : "", id: o.id, name: o.name, personal: o.personal ? "yes" : "" })), [" ", "id", "name", "personal"]),
        );
      }),
    );
  org
    .command("use")
    .description("act in this organization from now on (id or name)")
    .argument("<organization>", "organization id or name")
    .action(
      run(async (wanted: string, _opts: unknown, globals: GlobalOptions) => {
        const ctx = await openContext(globals, { needsOrganization: false });
        const { config } = ctx;
        if (config.apiKey) throw new CliError("An API key acts in its own organization only: sign in with `sandbar login` to switch organizations, or use that organization's key.");
        const { items } = await ctx.client(OrganizationService).listOrganizations({});
        const found = items.find((o) => o.id === wanted) ?? items.filter((o) => o.name === wanted).at(0);
        if (!found) throw new CliError(`You are not a member of an organization "${wanted}": \`sandbar org list\` shows yours.`);
        if (items.filter((o) => o.name === wanted).length > 1 && found.id !== wanted) throw new CliError(`Several organizations are named "${wanted}": use its id (\`sandbar org list\`).`);
        await updateProfile(config.configDir, profileName(config, globals.profile), { organizationId: found.id });
        ctx.out.result({ id: found.id, name: found.name }, () => console.log(`Now acting in ${ctx.out.paint("bold", found.name)} (${found.id}).`));
      }),
    );
}

async function login(globals: GlobalOptions, opts: { apiKey?: string; browser: boolean }): Promise<void> {
  const base = configOf(globals);
  const out = makeOutput({ json: Boolean(globals.json) });
  const name = profileName(base, globals.profile);
  const apiUrl = base.apiUrl;

  if (opts.apiKey !== undefined) {
    const apiKey = opts.apiKey.trim();
    if (!apiKey) throw new CliError("--api-key is empty: pass the key's value (it starts with sbr_).");
    // Checked before it is saved: a mistyped key fails here, not at the next command.
    const ctx = contextFor(resolveConfig({ apiKey, apiUrl, profile: globals.profile }), globals);
    const key = await ctx.client(ApiKeyService).getCurrentApiKey({});
    await updateProfile(base.configDir, name, { apiUrl, apiKey, jwtToken: undefined, refreshToken: undefined, tokenExpiresAt: undefined, organizationId: undefined });
    out.result({ apiUrl, profile: name, keyName: key.name }, () => console.log(`Saved API key ${out.paint("bold", key.name)} for ${apiUrl} (profile ${name}).`));
    return;
  }

  const { issuer, clientId, audience } = await serverOidc(apiUrl);
  const endpoints = await discover(issuer);
  const { verifier, challenge } = pkce();
  const state = randomBytes(16).toString("base64url");
  const redirect = await loopbackRedirect(state);
  try {
    const authorize = new URL(endpoints.authorization_endpoint);
    const params: Record<string, string> = {
      client_id: clientId, response_type: "code", redirect_uri: redirect.redirectUri, scope: "openid email profile offline_access",
      code_challenge: challenge, code_challenge_method: "S256", state,
    };
    if (audience) params.resource = audience;
    for (const [k, v] of Object.entries(params)) authorize.searchParams.set(k, v);
    process.stderr.write(`To sign in, open this URL in a browser:\n\n  ${authorize.href}\n\nWaiting for the browser (Ctrl-C to cancel)...\n`);
    if (opts.browser && process.env.SANDBAR_NO_BROWSER === undefined) openBrowser(authorize.href);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new CliError("No sign-in arrived within 5 minutes: run `sandbar login` again.")), LOGIN_TIMEOUT_MS)));
    const code = await Promise.race([redirect.code, timeout]).finally(() => clearTimeout(timer));
    const tokens = await tokenRequest(endpoints.token_endpoint, { grant_type: "authorization_code", code, redirect_uri: redirect.redirectUri, client_id: clientId, code_verifier: verifier });
    const signedIn = resolveConfig({ jwtToken: tokens.access_token, apiUrl, profile: globals.profile });
    const ctx = contextFor(signedIn, globals);
    const user = await ctx.client(UserService).getAuthenticatedUser({});
    const { items } = await ctx.client(OrganizationService).listOrganizations({});
    const org = chooseOrganization(items, base.sources.credentials === "config-file" ? base.organizationId : undefined);
    await updateProfile(base.configDir, name, { apiUrl, apiKey: undefined, ...tokenFields(tokens), organizationId: org?.id });
    out.result({ apiUrl, profile: name, userId: user.id, email: user.email, organizationId: org?.id }, () => {
      console.log(`Signed in as ${out.paint("bold", user.email || user.id)} at ${apiUrl}.`);
      console.log(org ? `Acting in ${org.name} (${org.id}); \`sandbar org use\` switches.` : "You belong to no organization yet.");
    });
  } finally {
    redirect.close();
  }
}

/** The organization kept from before, else the personal one, else the first. */
function chooseOrganization(items: Organization[], previous?: string): Organization | undefined {
  return items.find((o) => o.id === previous) ?? items.find((o) => o.personal) ?? items[0];
}

async function logout(globals: GlobalOptions): Promise<void> {
  const config = configOf(globals);
  const out = makeOutput({ json: Boolean(globals.json) });
  const name = profileName(config, globals.profile);
  const profile = readConfigFile(config.configDir)?.profiles[name];
  if (!profile || (!profile.apiKey && !profile.jwtToken && !profile.refreshToken)) {
    out.result({ profile: name, loggedOut: false }, () => console.log(`Profile ${name} holds no credentials.`));
    return;
  }
  // Best effort: a refresh token the issuer revokes cannot be replayed from a copied file.
  if (profile.refreshToken) {
    try {
      const { issuer, clientId } = await serverOidc(profile.apiUrl ?? config.apiUrl);
      const { revocation_endpoint } = await discover(issuer);
      if (revocation_endpoint) {
        await fetch(revocation_endpoint, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: new URLSearchParams({ token: profile.refreshToken, token_type_hint: "refresh_token", client_id: clientId }) });
      }
    } catch {
      // The server may be gone; the local copy is removed regardless.
    }
  }
  await updateProfile(config.configDir, name, { apiKey: undefined, jwtToken: undefined, refreshToken: undefined, tokenExpiresAt: undefined });
  out.result({ profile: name, loggedOut: true }, () => console.log(`Logged out of ${profile.apiUrl ?? config.apiUrl} (profile ${name}).`));
}

function openBrowser(url: string): void {
  const cmd = process.platform === "darwin" ? "open" : process.platform === "win32" ? "explorer" : "xdg-open";
  try {
    const child = spawn(cmd, [url], { stdio: "ignore", detached: true });
    child.on("error", () => {});
    child.unref();
  } catch {
    // No browser opener: the URL is printed above.
  }
}

export function permissionName(p: number): string {
  return (Permission[p] ?? String(p)).replace(/^PERMISSION_/, "").toLowerCase().replace(/_/, ":");
}
