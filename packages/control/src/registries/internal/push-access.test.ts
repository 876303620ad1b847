import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { TestRegistry } from "../../../../runner/src/images/testing/registry.ts";
import { pushTestImage } from "../../snapshots/testing/image.ts";
import { buildAgentBundle } from "../../testing/agent-bundle.ts";
import { issuerSettings, TestIssuer } from "../../testing/issuer.ts";
import { api, startTestServer, type TestServer } from "../../testing/server.ts";
import { MAX_LIVE_ACCOUNTS } from "./credentials.ts";
import { PUSH_ACCESS_SECONDS } from "./index.ts";
import type { UntypedJson } from "../../casts.ts";

// The internal registry end to end: a real server (embedded PostgreSQL) running Debian's
// docker-registry with token auth against its own token service; images pushed with skopeo using
// the credentials registry-push-access answers; a snapshot and a real sandbox (root) from one.

interface Access {
  username: string;
  secret: string;
  registryUrl: string;
  registryId: string;
  project: string;
  expiresAt: string;
}

let t: TestServer;
let db: pg.Client;
let scratch: string;
let bundle: string;
let layout: string;
let other: string;
let otherOrg: string;
const idp = new TestIssuer();
const call = (verb: string, p: string, body?: unknown, key = t.adminKey) => api(t.url, key, verb, p, body);
const asOther = (verb: string, p: string, body?: unknown) => api(t.url, other, verb, p, body, { "x-sandbar-organization-id": otherOrg });

/** skopeo with `access`'s credentials in an auth file (never argv); resolves to its exit and stderr. */
async function skopeo(access: Pick<Access, "registryUrl" | "username" | "secret">, args: string[]): Promise<{ code: number; stderr: string }> {
  const authfile = path.join(scratch, `auth-${Math.random().toString(36).slice(2)}.json`);
  await writeFile(authfile, JSON.stringify({ auths: { [access.registryUrl]: { auth: Buffer.from(`${access.username}:${access.secret}`).toString("base64") } } }), { mode: 0o600 });
  try {
    return await new Promise((resolve, reject) => {
      const child = spawn("skopeo", [args[0]!, "--authfile", authfile, ...args.slice(1)], { stdio: ["ignore", "ignore", "pipe"], env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: scratch } });
      let stderr = "";
      child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
      child.on("error", reject);
      child.on("close", (code) => resolve({ code: code ?? -1, stderr }));
    });
  } finally {
    await rm(authfile, { force: true });
  }
}
const push = (a: Access, repo: string) => skopeo(a, ["copy", "--quiet", "--dest-tls-verify=false", `oci:${layout}:app`, `docker://${a.registryUrl}/${repo}`]);
const inspect = (a: Access, repo: string) => skopeo(a, ["inspect", "--raw", "--tls-verify=false", `docker://${a.registryUrl}/${repo}`]);

async function waitFor(id: string, states: string[], as = call, ms = 60_000): Promise<UntypedJson> {
  const until = Date.now() + ms;
  for (;;) {
    const r = await as("GET", `/snapshots/${id}`);
    if (states.includes(r.body.state)) return r.body;
    if (Date.now() > until) throw new Error(`snapshot ${id} still ${r.body.state}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), "sandbar-push-"));
  bundle = await buildAgentBundle("sandbar-push-agent-");
  await idp.start();
  await idp.addKey("k");
  t = await startTestServer({ settings: { ...issuerSettings(idp), agentBundle: bundle, internalRegistry: { enabled: true, host: "127.0.0.1", port: 0 } } });
  db = new pg.Client({ connectionString: t.server.databaseUrl });
  await db.connect();
  other = await idp.sign("k", { sub: "orla", email: "orla@example.test", name: "orla" });
  otherOrg = (await api(t.url, other, "GET", "/organizations")).body[0].id;
}, 180_000);

afterAll(async () => {
  await db?.end();
  await t?.stop();
  idp.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
  if (bundle) await rm(bundle, { recursive: true, force: true });
});

describe("internal registry push access", () => {
  let mine: Access;

  it("answers short-lived credentials for the organization's namespace in the reference's shape, secret kept only as a hash", async () => {
    const r = await call("GET", "/docker-registry/registry-push-access");
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    mine = r.body;
    const org = (await call("GET", "/organizations")).body[0].id;
    expect(mine).toEqual({
      username: expect.stringMatching(/^robot\$[0-9a-f]{24}$/),
      secret: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      registryUrl: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
      registryId: expect.stringMatching(/^[0-9a-f-]{36}$/),
      project: org,
      expiresAt: expect.any(String),
    });
    const ttl = (Date.parse(mine.expiresAt) - Date.now()) / 1000;
    expect(ttl).toBeGreaterThan(PUSH_ACCESS_SECONDS - 60);
    expect(ttl).toBeLessThanOrEqual(PUSH_ACCESS_SECONDS);
    const row = (await db.query(`select * from registry_push_credential where username = $1`, [mine.username])).rows[0];
    expect(row).toMatchObject({ organization_id: org, actions: "pull,push" });
    expect(JSON.stringify(row)).not.toContain(mine.secret);
    // The registry's row is the transient one, not among the organization's registries.
    expect((await db.query(`select registry_type, organization_id from docker_registry where id = $1`, [mine.registryId])).rows[0]).toEqual({ registry_type: "transient", organization_id: null });
    expect((await call("GET", "/docker-registry")).body).toEqual([]);
    // Each call is a new account.
    const again = (await call("GET", "/docker-registry/registry-push-access")).body as Access;
    expect(again.username).not.toBe(mine.username);
    expect(again.registryId).toBe(mine.registryId);
  });

  it("needs write:snapshots or write:sandboxes; an unknown region is a 404", async () => {
    const key = async (permissions: string[]) => (await call("POST", "/api-keys", { name: `k-${permissions.join("-")}`, permissions })).body.value as string;
    const denied = await call("GET", "/docker-registry/registry-push-access", undefined, await key(["write:registries"]));
    expect(denied.status).toBe(403);
    expect(denied.body.message).toBe("Access denied");
    for (const scope of ["write:snapshots", "write:sandboxes"]) expect((await call("GET", "/docker-registry/registry-push-access", undefined, await key([scope]))).status, scope).toBe(200);
    const region = await call("GET", "/docker-registry/registry-push-access?regionId=nowhere");
    expect(region.status).toBe(404);
    expect(region.body.message).toBe("Region not found");
    expect((await call("GET", "/docker-registry/registry-push-access", undefined, "sbr_wrong")).status).toBe(401);
  });

  it("an image pushed with them becomes a snapshot (pulled with the organization's own account) and boots a sandbox", async () => {
    const reg: TestRegistry = {
      host: mine.registryUrl,
      username: mine.username,
      password: mine.secret,
      dir: scratch,
      async push(l, name, repo) {
        const r = await skopeo(mine, ["copy", "--quiet", "--dest-tls-verify=false", `oci:${l}:${name}`, `docker://${mine.registryUrl}/${repo}`]);
        if (r.code !== 0) throw new Error(r.stderr);
        return "";
      },
      stop: async () => undefined,
    };
    const image = await pushTestImage(reg, scratch, `${mine.project}/app:1.0`);
    layout = path.join(scratch, "layout");
    const made = await call("POST", "/snapshots", { name: "pushed", imageName: image });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const active = await waitFor(made.body.id, ["active", "error"]);
    expect(active.errorReason ?? null, active.errorReason).toBeNull();
    expect(active.state).toBe("active");
    // The pull's own account is pull-only and short-lived, and the next pull reuses it.
    const pullers = async () => (await db.query(`select actions, expires_at from registry_push_credential where actions = 'pull' and organization_id = $1`, [mine.project])).rows;
    expect(await pullers()).toHaveLength(1);
    expect((await pullers())[0].expires_at.getTime() - Date.now()).toBeLessThanOrEqual(900_000);
    const again = await call("POST", "/snapshots", { name: "pushed-again", imageName: image });
    expect((await waitFor(again.body.id, ["active", "error"])).state).toBe("active");
    expect(await pullers()).toHaveLength(1);

    const s = await call("POST", "/sandbox", { snapshot: "pushed" });
    expect(s.status, JSON.stringify(s.body)).toBe(200);
    expect(s.body.state).toBe("started");
    const r = await call("POST", `/toolbox/${s.body.id}/toolbox/process/execute`, { command: 'cat /app/hello.txt; echo "$APP_MODE"' });
    expect(r.body).toEqual({ exitCode: 0, result: "hello from the image\nimage\n" });
    expect((await call("DELETE", `/sandbox/${s.body.id}`)).status).toBe(200);
  }, 180_000);

  it("another organization's credentials can neither push nor pull in this namespace; its snapshot of the image fails", async () => {
    const theirs = (await asOther("GET", "/docker-registry/registry-push-access")).body as Access;
    expect(theirs.project).toBe(otherOrg);
    expect(theirs.registryUrl).toBe(mine.registryUrl);
    // Their own namespace works (so what follows fails for the namespace, not the credentials).
    expect((await push(theirs, `${otherOrg}/own:1.0`)).code).toBe(0);
    expect((await inspect(theirs, `${otherOrg}/own:1.0`)).code).toBe(0);

    const pushed = await push(theirs, `${mine.project}/evil:1.0`);
    expect(pushed.code).not.toBe(0);
    expect(pushed.stderr).toMatch(/denied|unauthorized|authentication required/i);
    const pulled = await inspect(theirs, `${mine.project}/app:1.0`);
    expect(pulled.code).not.toBe(0);
    expect(pulled.stderr).toMatch(/denied|unauthorized|authentication required/i);
    // Nor elsewhere outside it, nor by the name's prefix.
    expect((await push(theirs, "library/evil:1.0")).code).not.toBe(0);
    expect((await push(theirs, `${mine.project}x/evil:1.0`)).code).not.toBe(0);
    // Mine cannot write into theirs either.
    expect((await push(mine, `${otherOrg}/mine:1.0`)).code).not.toBe(0);

    const snap = await asOther("POST", "/snapshots", { name: "stolen", imageName: `${mine.registryUrl}/${mine.project}/app:1.0` });
    expect(snap.status, JSON.stringify(snap.body)).toBe(200);
    const failed = await waitFor(snap.body.id, ["active", "error"], asOther);
    expect(failed.state).toBe("error");
    expect(failed.errorReason).toMatch(/denied|refused the credentials/);
  }, 120_000);

  it(`caps an organization at ${MAX_LIVE_ACCOUNTS} unexpired push accounts (429), counting only unexpired ones`, async () => {
    const fill = (n: number, expires: string) =>
      db.query(
        `insert into registry_push_credential (organization_id, username, secret_hash, actions, expires_at)
         select $1, 'robot$' || substr(md5(random()::text), 1, 24), md5(random()::text) || md5(random()::text), 'pull,push', clock_timestamp() + $3::interval from generate_series(1, $2)`,
        [otherOrg, n, expires],
      );
    const live = async () => (await db.query(`select count(*)::int as n from registry_push_credential where organization_id = $1 and actions = 'pull,push' and expires_at > now()`, [otherOrg])).rows[0].n as number;
    await fill(MAX_LIVE_ACCOUNTS - (await live()), "1 hour");
    const refused = await asOther("GET", "/docker-registry/registry-push-access");
    expect(refused.status).toBe(429);
    expect(refused.body.message).toBe(`The organization has ${MAX_LIVE_ACCOUNTS} unexpired registry accounts, the most allowed: they expire an hour after they are issued`);
    // Another organization is not held back by it, and expiry frees the place.
    expect((await call("GET", "/docker-registry/registry-push-access")).status).toBe(200);
    await db.query(`update registry_push_credential set expires_at = clock_timestamp() - interval '1 second' where organization_id = $1`, [otherOrg]);
    expect((await asOther("GET", "/docker-registry/registry-push-access")).status).toBe(200);
  });

  it("refuses expired, wrong and unknown credentials at the token service", async () => {
    const fresh = (await call("GET", "/docker-registry/registry-push-access")).body as Access;
    expect((await inspect(fresh, `${fresh.project}/app:1.0`)).code).toBe(0);
    // The realm the registry names in its challenge.
    const challenge = (await fetch(`http://${fresh.registryUrl}/v2/`)).headers.get("www-authenticate") ?? "";
    const realm = /realm="([^"]+)"/.exec(challenge)?.[1];
    const service = /service="([^"]+)"/.exec(challenge)?.[1];
    expect(realm).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/token$/);
    const token = (username: string, secret: string) =>
      fetch(`${realm}?service=${service}&scope=repository:${fresh.project}/app:pull`, { headers: { authorization: `Basic ${Buffer.from(`${username}:${secret}`).toString("base64")}` } });
    const ok = await token(fresh.username, fresh.secret);
    expect(ok.status).toBe(200);
    const claims = JSON.parse(Buffer.from(((await ok.json()) as { token: string }).token.split(".")[1]!, "base64url").toString());
    expect(claims.access).toEqual([{ type: "repository", name: `${fresh.project}/app`, actions: ["pull"] }]);
    expect(claims.exp - claims.iat).toBeLessThanOrEqual(300);

    expect((await token(fresh.username, fresh.secret + "x")).status).toBe(401);
    expect((await token("robot$000000000000000000000000", fresh.secret)).status).toBe(401);
    expect((await fetch(`${realm}?service=${service}`)).status).toBe(401);

    await db.query(`update registry_push_credential set expires_at = clock_timestamp() - interval '1 second' where username = $1`, [fresh.username]);
    expect((await token(fresh.username, fresh.secret)).status).toBe(401);
    const refused = await inspect(fresh, `${fresh.project}/app:1.0`);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/unauthorized|authentication required|401/i);
  }, 60_000);
});
