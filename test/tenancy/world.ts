/**
 * The two organizations of the tenancy suite, made through the API as their people would.
 *
 * A: alice's organization: alice (owner, signed in), a full-scope key (managed keys on, so
 *    key-management routes are reachable with a key), erin (a plain member holding every
 *    permission through an assigned role).
 * B: bob's organization, holding one of each kind of resource the API can make: a started
 *    sandbox with a name, a process session, a command and a terminal in it, keys (bob's, one made by a
 *    managing key, and erin's), a role, members (dan, erin), a pending invitation, a custom
 *    region, a container registry (B's default), an OpenTelemetry and an experimental config, a webhook endpoint (disabled, so nothing
 *    is delivered and B's rows stay still).
 * erin belongs to both: signed in with A's header she must not reach B's things either (a service
 * that filters by "organizations the user belongs to" instead of the call's organization fails).
 * The bootstrap admin key (the "Default" organization, a system admin) calls too.
 */
import { expect } from "vitest";
import type { UntypedJson } from "../../packages/control/src/casts.ts";
import { ALL_SCOPES } from "../../packages/control/src/auth/scopes.ts";
import type { TestIssuer } from "../../packages/control/src/testing/issuer.ts";
import { api, type TestServer } from "../../packages/control/src/testing/server.ts";
import { eventually } from "../../packages/protocol/src/testing/eventually.ts";

/** Who calls B's ids: a token and the headers that select its organization. */
export interface Caller {
  name: string;
  token: string;
  header: Record<string, string>;
  /** The organization the call acts in (its own resources may legitimately answer). */
  org: string;
  /** A system admin: operator routes act on any organization by contract. */
  operator: boolean;
  /** Also a member of B: routes naming B's organization are legitimately theirs. */
  memberOfB: boolean;
}

export interface World {
  A: { org: string; personal: string; key: string; owner: Caller; member: Caller; keyCaller: Caller; memberRole: string; invitation: string };
  B: {
    org: string;
    header: Record<string, string>;
    ownerJwt: string;
    /** erin's JWT: use with B's header to act in B. */
    memberJwt: string;
    key: string;
    keyNames: string[];
    sandbox: string;
    sandboxName: string;
    session: string;
    command: string;
    authToken: string;
    role: string;
    invitation: string;
    region: string;
    /** B's runner, registered in B's region (no runner process behind it: it stays `initializing`). */
    runner: string;
    registry: string;
    webhookEndpoint: string;
    /** B's volume, named `b-volume`. */
    volume: string;
    /** B's warm pool of the default snapshot (size 0). */
    warmPool: string;
    /** A snapshot of B's (its image is on no registry: it ends in `error`, a real row all the same). */
    snapshot: string;
    owner: string;
    members: string[];
  };
  operator: Caller;
  callers: Caller[];
}

type Call = (verb: string, path: string, body?: unknown) => Promise<{ status: number; body: UntypedJson }>;

function caller(t: TestServer, token: string, header: Record<string, string> = {}): Call {
  return async (verb, path, body) => {
    const r = await api(t.url, token, verb, path, body, header);
    if (r.status >= 300) expect.fail(`${verb} ${path} → ${r.status} ${JSON.stringify(r.body)}`);
    return r;
  };
}

/** A signed-in person (the user row appears on first use). */
const signIn = (idp: TestIssuer, sub: string) => idp.sign("k", { sub, email: `${sub}@example.test`, email_verified: true, name: sub });

/** `who` joins `org` through an invitation they accept. */
async function join(t: TestServer, inviter: Call, org: string, who: string, jwt: string, assignedRoleIds: string[]): Promise<void> {
  const inv = await inviter("POST", `/organizations/${org}/invitations`, { email: `${who}@example.test`, role: "member", assignedRoleIds });
  await caller(t, jwt)("POST", `/organizations/invitations/${inv.body.id}/accept`);
}

export async function buildWorld(t: TestServer, idp: TestIssuer): Promise<World> {
  const admin = caller(t, t.adminKey);
  const [alice, bob, erin, dan] = await Promise.all(["alice", "bob", "erin", "dan"].map((s) => signIn(idp, s)));

  // Two organizations with managed keys on (so a key may list, read and delete keys).
  const orgOf = async (jwt: string, name: string) => {
    const org = (await caller(t, jwt)("POST", "/organizations", { name, defaultRegionId: "local" })).body.id as string;
    await admin("PUT", `/admin/organizations/${org}/managed-api-keys`, { enabled: true });
    return { org, header: { "x-sandbar-organization-id": org } };
  };
  const a = await orgOf(alice, "alice inc");
  const b = await orgOf(bob, "bob inc");
  const asAlice = caller(t, alice, a.header);
  const asBob = caller(t, bob, b.header);

  const aKey = (await asAlice("POST", "/api-keys", { name: "alice-key", permissions: ALL_SCOPES })).body.value as string;
  const aRole = (await asAlice("POST", `/organizations/${a.org}/roles`, { name: "a-all", description: "everything", permissions: ALL_SCOPES })).body.id as string;
  const aInvitation = (await asAlice("POST", `/organizations/${a.org}/invitations`, { email: "frank@example.test", role: "member" })).body.id as string;
  await join(t, asAlice, a.org, "erin", erin, [aRole]);
  // Every organization made today gets a default region, and it may be set only while unset (as
  // for organizations older than regions): alice's personal one is made such, so that choosing
  // B's region as a default reaches the region lookup.
  const personal = ((await caller(t, alice)("GET", "/organizations")).body as Array<{ id: string; personal: boolean }>).find((o) => o.personal)!.id;
  await t.server.orm.em.getConnection().execute(`update organization set default_region_id = null where id = ?`, [personal]);

  const bKey = (await asBob("POST", "/api-keys", { name: "bob-key", permissions: ALL_SCOPES })).body.value as string;
  await caller(t, bKey)("POST", "/api-keys", { name: "b-managed-key", permissions: ["read:volumes"] });
  const bRole = (await asBob("POST", `/organizations/${b.org}/roles`, { name: "b-role", description: "B's", permissions: ["read:volumes"] })).body.id as string;
  await join(t, asBob, b.org, "erin", erin, [bRole]);
  await join(t, asBob, b.org, "dan", dan, [bRole]);
  await caller(t, erin, b.header)("POST", "/api-keys", { name: "erin-b-key", permissions: ["read:volumes"] });
  const bInvitation = (await asBob("POST", `/organizations/${b.org}/invitations`, { email: "carol@example.test", role: "member", assignedRoleIds: [bRole] })).body.id as string;
  const bRegion = (await asBob("POST", "/regions", { name: "b-region", proxyUrl: "https://proxy.b.example.test" })).body.id as string;
  const bRunner = (await asBob("POST", "/runners", { regionId: bRegion, name: "b-runner" })).body.id as string;
  const bRegistry = (await asBob("POST", "/docker-registry", { name: "b-registry", url: "registry.b.example.test", username: "b-robot", password: "b-registry-pw", project: "b" })).body.id as string;
  expect((await asBob("POST", `/docker-registry/${bRegistry}/set-default`)).status).toBe(200);
  await asBob("PUT", `/organizations/${b.org}/otel-config`, { endpoint: "https://otel.b.example.test", headers: { "x-b": "secret-b" } });
  await asBob("PUT", `/organizations/${b.org}/experimental-config`, { tenant: "b" });
  const bEndpoint = (await asBob("POST", `/webhooks/organizations/${b.org}/endpoints`, { url: "https://hooks.b.example.test/in", enabled: false })).body.endpoint.id as string;

  const bSnapshot = (await asBob("POST", "/snapshots", { name: "b-snapshot", imageName: "127.0.0.1:9/b/image:1.0" })).body.id as string;
  // Its pull settles before the sweep takes B's rows (port 9 refuses at once).
  await eventually("B's snapshot to settle in error", async () => (await asBob("GET", `/snapshots/${bSnapshot}`)).body.state === "error", 30_000);

  const asBKey = caller(t, bKey);
  const bVolume = (await asBKey("POST", "/volumes", { name: "b-volume" })).body.id as string;
  // A pool that keeps nothing started: B's row, no sandboxes.
  const bWarmPool = (await asBKey("POST", "/warm-pools", { snapshot: "sandbar-default", pool: 0 })).body.id as string;
  const sandbox = (await asBKey("POST", "/sandbox", { name: "b-box", autoStopInterval: 0, labels: { tenant: "b" } })).body.id as string;
  // A process session and a terminal under the same id: toolbox routes name either by `session_id`.
  await asBKey("POST", `/toolbox/${sandbox}/toolbox/process/session`, { sessionId: "b-session" });
  await asBKey("POST", `/toolbox/${sandbox}/toolbox/process/pty`, { id: "b-session", lazyStart: true });
  const command = (await asBKey("POST", `/toolbox/${sandbox}/toolbox/process/session/b-session/exec`, { command: "echo b" })).body.cmdId as string;
  expect(command).toBeTruthy();
  const exec = (sql: string, params: unknown[]) => t.server.orm.em.getConnection().execute(sql, params);
  const authToken = (await exec(`select auth_token from sandbox where id = ?`, [sandbox]))[0].auth_token as string;
  const defaultOrg = (await exec(`select organization_id from api_key where organization_id not in (?, ?) order by created_at limit 1`, [a.org, b.org]))[0].organization_id as string;

  const owner: Caller = { name: "A's signed-in owner", token: alice, header: a.header, org: a.org, operator: false, memberOfB: false };
  const member: Caller = { name: "A's signed-in member (also B's member)", token: erin, header: a.header, org: a.org, operator: false, memberOfB: true };
  const keyCaller: Caller = { name: "A's full-scope key", token: aKey, header: {}, org: a.org, operator: false, memberOfB: false };
  const operator: Caller = { name: "the bootstrap admin key (Default organization, system admin)", token: t.adminKey, header: {}, org: defaultOrg, operator: true, memberOfB: false };
  return {
    A: { org: a.org, personal, key: aKey, owner, member, keyCaller, memberRole: aRole, invitation: aInvitation },
    B: {
      org: b.org,
      header: b.header,
      ownerJwt: bob,
      memberJwt: erin,
      key: bKey,
      keyNames: ["bob-key", "b-managed-key", "erin-b-key"],
      sandbox,
      sandboxName: "b-box",
      session: "b-session",
      command,
      authToken,
      role: bRole,
      invitation: bInvitation,
      region: bRegion,
      runner: bRunner,
      registry: bRegistry,
      webhookEndpoint: bEndpoint,
      volume: bVolume,
      warmPool: bWarmPool,
      snapshot: bSnapshot,
      owner: "bob",
      members: ["dan", "erin"],
    },
    operator,
    callers: [keyCaller, owner, member, operator],
  };
}
