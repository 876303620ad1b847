import type { DescMethod } from "@bufbuild/protobuf";
import { Auth, errors, routeOf, type Route } from "@sandbar/protocol";
import type { Credentials } from "./credentials.ts";
import type { AuthContext, Principal } from "./principal.ts";
import { ALL_SCOPES } from "./scopes.ts";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const invalidContext = () => errors.permissionDenied("Invalid authentication context");

/** Organization selection header, and the reference clients' spelling of it. */
export const ORG_HEADERS = ["x-sandbar-organization-id", "x-daytona-organization-id"];

/**
 * The one place where every call, REST or RPC, is authenticated and authorized, from the
 * method's Route option: which credentials it accepts, which organization it acts in, and
 * which scope it needs.
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

    // An API key acts in its own organization; a path naming another one is refused.
    const named = organizationIdIn(message);
    let organizationId: string | undefined;
    if (principal.apiKey) {
      organizationId = principal.apiKey.organizationId;
      if (named && named !== organizationId) throw invalidContext();
    } else {
      organizationId = named || ORG_HEADERS.map((h) => header.get(h)).find(Boolean) || undefined;
    }
    if (!organizationId || !UUID.test(organizationId)) throw invalidContext();
    const memberRole = await this.credentials.memberRole(organizationId, principal.userId);
    if (!memberRole) throw invalidContext();

    if (route.scope) {
      // A key is limited to its scopes, even an owner's; an owner with a JWT may do everything.
      const allowed = principal.apiKey ? principal.apiKey.permissions.has(route.scope) : memberRole === "owner";
      if (!allowed) throw errors.permissionDenied("Access denied");
    }
    return { principal, organizationId, memberRole };
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
