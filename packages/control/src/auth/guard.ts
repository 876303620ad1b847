import type { DescMethod } from "@bufbuild/protobuf";
import { Auth, errors, routeOf, type Route } from "@sandbar/protocol";
import type { Credentials } from "./credentials.ts";
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

  constructor(credentials: Credentials) {
    this.credentials = credentials;
  }

  /** `route` overrides the method's own option (the toolbox mounts agent methods with its own policy). */
  async check(method: DescMethod, header: Headers, message: unknown, route: Route = routeOf(method)): Promise<AuthContext> {
    if (route.auth === Auth.PUBLIC) return {};
    const principal = await this.credentials.authenticate(header.get("authorization"));
    if (route.auth === Auth.JWT && principal.kind !== "jwt") throw errors.unauthenticated();
    if (route.auth === Auth.API_KEY && principal.kind !== "api-key") throw errors.unauthenticated();
    if (route.auth === Auth.SYSTEM_ADMIN && !isOperator(principal)) throw errors.permissionDenied("Access denied");
    if (route.userLevel) return { principal };

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

    if (route.owner && access.role !== "owner") throw errors.permissionDenied("Access denied");
    // A key is limited to its scopes, even an owner's; a signed-in owner holds every scope, a
    // member those of their assigned roles.
    const permissions = principal.apiKey ? principal.apiKey.permissions : access.role === "owner" ? ALL : access.permissions;
    if (route.scope) {
      if (!permissions.has(route.scope)) throw errors.permissionDenied("Access denied");
      if (access.suspension !== undefined && SUSPENDABLE.test(route.scope)) {
        throw errors.permissionDenied(access.suspension ? `Organization is suspended: ${access.suspension}` : "Organization is suspended");
      }
    }
    return { principal, organizationId, memberRole: access.role, permissions };
  }
}

/** Operator routes: a system admin, and with an API key only a full-scope one (not a narrowed child). */
function isOperator(principal: Principal): boolean {
  if (principal.systemRole !== "admin") return false;
  return !principal.apiKey || ALL_SCOPES.every((s) => principal.apiKey!.permissions.has(s));
}

function organizationIdIn(message: unknown): string | undefined {
  const id = (message as { organizationId?: unknown } | undefined)?.organizationId;
  return typeof id === "string" && id !== "" ? id : undefined;
}
