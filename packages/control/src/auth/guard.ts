import type { DescMethod } from "@bufbuild/protobuf";
import { Auth, Code, ConnectError, errors, routeOf, type Route } from "@sandbar/protocol";
import type { Figures } from "../limits/figures.ts";
import type { RateLimits } from "../limits/rate-limits.ts";
import type { Credentials, MemberAccess } from "./credentials.ts";
import type { AuthContext, Principal } from "./principal.ts";
import { ALL_SCOPES } from "./scopes.ts";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const invalidContext = () => errors.permissionDenied("Invalid authentication context");
const ALL = new Set(ALL_SCOPES);

/** Organization selection header, and the reference clients' spelling of it. */
export const ORG_HEADERS = ["x-sandbar-organization-id", "x-daytona-organization-id"];

/** Scopes of the routes that change sandboxes, snapshots or volumes: refused while an organization is suspended. */
const SUSPENDABLE = /^(write|delete):(sandboxes|snapshots|volumes)$/;

/**
 * The one place where every call, REST or RPC, is authenticated and authorized, from the
 * method's Route option: which credentials it accepts, which organization it acts in, whether
 * it needs an owner, and which scope it needs.
 */
export class Guard {
  private readonly credentials: Credentials;
  private readonly limits?: RateLimits;

  constructor(credentials: Credentials, limits?: RateLimits) {
    this.credentials = credentials;
    this.limits = limits;
  }

  /**
   * `route` overrides the method's own option (the toolbox mounts agent methods with its own
   * policy). The call is also counted against its rate limit (see CallSite), and an address
   * blocked for failed authentications is refused before its credentials are read.
   */
  async check(method: DescMethod, header: Headers, message: unknown, route: Route = routeOf(method), call: CallSite = {}): Promise<AuthContext> {
    return this.#admit(route, call, () => this.authorize(header, message, route, call));
  }

  /**
   * A call whose protocol has credentials of its own (the S3 endpoint's signatures, the internal
   * registry's basic auth): `verify` checks them (UNAUTHENTICATED when wrong) and says who the
   * call acts for; the address is throttled for failed attempts and the call counted under `route`
   * as for any other.
   */
  async checkForeign(route: Route, call: CallSite, verify: () => Promise<AuthContext>): Promise<AuthContext> {
    return this.#admit(route, call, async () => ({ auth: await verify() }));
  }

  async #admit(route: Route, call: CallSite, authorize: () => Promise<Authorized>): Promise<AuthContext> {
    const { limits } = this;
    const address = call.address ?? "";
    if (!limits) return (await authorize()).auth;
    const lookup = limits.refuseBlocked(address);
    if (lookup) await lookup;
    let authorized: Authorized;
    try {
      authorized = await authorize();
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.Unauthenticated) throw await limits.failedAuthentication(address, err);
      throw err;
    }
    const { auth, access } = authorized;
    if (!call.counted) {
      // A key always acts for its organization (user-level routes too); a JWT on those counts for its user.
      const organizationId = auth.organizationId ?? auth.principal?.apiKey?.organizationId;
      call.figures = await limits.count(route, { address, organizationId, userId: auth.principal?.userId, overrides: access?.rateLimits });
      call.counted = true;
    }
    return auth;
  }

  private async authorize(header: Headers, message: unknown, route: Route, call: CallSite): Promise<Authorized> {
    if (route.auth === Auth.PUBLIC) return { auth: {} };
    const principal = (call.principal ??= await this.credentials.authenticate(header.get("authorization")));
    if (route.auth === Auth.JWT && principal.kind !== "jwt") throw errors.unauthenticated();
    if (route.auth === Auth.API_KEY && principal.kind !== "api-key") throw errors.unauthenticated();
    if (route.auth === Auth.SYSTEM_ADMIN && !isOperator(principal)) throw errors.permissionDenied("Access denied");
    if (route.userLevel) return { auth: { principal } };

    // An organization named in the path is a resource: one the caller cannot act in does not
    // exist for them (404, as for any other organization's resource). One chosen by the header
    // (or the key) is context: a wrong one is 403.
    const named = organizationIdIn(message);
    const notFound = () => errors.notFound(`Organization with ID ${named} not found`);
    if (named && !UUID.test(named)) throw notFound();
    let organizationId: string | undefined;
    if (principal.apiKey) {
      organizationId = principal.apiKey.organizationId;
      if (named && named !== organizationId) throw notFound();
    } else {
      organizationId = named || ORG_HEADERS.map((h) => header.get(h)).find(Boolean) || undefined;
    }
    if (!organizationId || !UUID.test(organizationId)) throw invalidContext();
    const access = await this.credentials.memberAccess(organizationId, principal.userId);
    if (!access) throw named ? notFound() : invalidContext();

    // What the member holds now (an owner every scope, a member their roles'); a key acts with
    // the part of it its scopes name, so it never outlives a permission its creator lost.
    const owner = access.role === "owner";
    const held = owner ? ALL : access.permissions;
    const permissions = principal.apiKey ? within(principal.apiKey.permissions, held) : held;
    // Owner-only routes (members, invitations, roles, webhooks, OTel) have no scope of their own:
    // a key may call them only when it holds every scope, i.e. acts as its owner in full.
    if (route.owner && (!owner || !fullScope(permissions))) throw errors.permissionDenied("Access denied");
    if (route.scope) {
      if (!permissions.has(route.scope)) throw errors.permissionDenied("Access denied");
      if (access.suspension !== undefined && SUSPENDABLE.test(route.scope)) {
        throw errors.permissionDenied(access.suspension ? `Organization is suspended: ${access.suspension}` : "Organization is suspended");
      }
    }
    return { auth: { principal, organizationId, memberRole: access.role, permissions }, access };
  }
}

/** Where a call comes from and where its rate-limit figures go (the chain's Call is one). */
export interface CallSite {
  /** The client's address: anonymous calls and failed authentications are counted by it. */
  address?: string;
  /** Set by the check: where the call stands against its counter (for the X-RateLimit-* headers). */
  figures?: Figures;
  /** Set by the check once the request is counted: a request is counted once. */
  counted?: boolean;
  /**
   * Who the request's credentials name; set by the check. Authenticating costs a database round
   * trip (the revocation barrier), which a request pays once.
   */
  principal?: Principal;
}

interface Authorized {
  auth: AuthContext;
  access?: MemberAccess;
}

/** Operator routes: a system admin, and with an API key only a full-scope one (not a narrowed child). */
export function isOperator(principal: Principal): boolean {
  if (principal.systemRole !== "admin") return false;
  return !principal.apiKey || fullScope(principal.apiKey.permissions);
}

/** Holds every scope of the contract. */
const fullScope = (scopes: ReadonlySet<string>) => ALL_SCOPES.every((s) => scopes.has(s));

/** The key's scopes its creator still holds (the key's own set when they all are). */
function within(key: ReadonlySet<string>, held: ReadonlySet<string>): ReadonlySet<string> {
  if (held === ALL) return key;
  const kept = new Set<string>();
  for (const s of key) if (held.has(s)) kept.add(s);
  return kept;
}

function organizationIdIn(message: unknown): string | undefined {
  const id = (message as { organizationId?: unknown } | undefined)?.organizationId;
  return typeof id === "string" && id !== "" ? id : undefined;
}
