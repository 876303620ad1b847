/**
 * What to put in each path parameter (and the matching request field over gRPC): B's ids, and an
 * id of the same shape that exists nowhere. A parameter missing from this table is not filled:
 * the suite fails, so a route with a new kind of id must be mapped here before it ships.
 */
import { randomUUID } from "node:crypto";
import type { World } from "./world.ts";

export interface ParamIds {
  /** B's values; each is tried. */
  theirs: string[];
  /** Values that are the caller's own rather than B's: compared with themselves (an own user id beside B's key name). */
  own?: string[];
  /** A value of the same shape that names nothing. */
  nobody: string;
  /** False for values any caller may send (ports, intervals, flags): not another organization's. */
  resource: boolean;
}

const plain = (value: string): ParamIds => ({ theirs: [value], nobody: value, resource: false });


export function idsFor(w: World, service: string, param: string): ParamIds | undefined {
  const { B } = w;
  const nobodyUuid = randomUUID();
  switch (param) {
    case "organization_id":
      return { theirs: [B.org], nobody: nobodyUuid, resource: true };
    case "sandbox_id":
    case "sandbox_id_or_name":
      // The preview proxy's checks take ids only, as the reference's do.
      if (service === "PreviewService") return { theirs: [B.sandbox], nobody: nobodyUuid, resource: true };
      return { theirs: [B.sandbox, B.sandboxName], nobody: nobodyUuid, resource: true };
    case "role_id":
      return { theirs: [B.role], nobody: nobodyUuid, resource: true };
    case "invitation_id":
      return { theirs: [B.invitation], nobody: nobodyUuid, resource: true };
    case "user_id":
      // erin is B's member but also the member of A who calls: her own keys in B are B's.
      if (service === "ApiKeyService") return { theirs: [B.owner, ...B.members], own: ["erin"], nobody: "nobody-at-all", resource: true };
      return { theirs: [B.owner, "dan"], nobody: "nobody-at-all", resource: true };
    case "name":
      if (service === "ApiKeyService") return { theirs: B.keyNames, nobody: "no-such-key", resource: true };
      if (service === "VolumeService") return { theirs: ["b-volume"], nobody: "no-such-volume", resource: true };
      return undefined;
    case "id":
      if (service === "RegionService") return { theirs: [B.region], nobody: `nowhere-${nobodyUuid.slice(0, 8)}`, resource: true };
      if (service === "UserService") return { theirs: [B.owner, "dan"], nobody: "nobody-at-all", resource: true };
      if (service === "DockerRegistryService") return { theirs: [B.registry], nobody: nobodyUuid, resource: true };
      if (service === "SnapshotService") return { theirs: [B.snapshot, "b-snapshot"], nobody: nobodyUuid, resource: true };
      if (service === "RunnerService") return { theirs: [B.runner], nobody: nobodyUuid, resource: true };
      if (service === "WarmPoolService") return { theirs: [B.warmPool], nobody: nobodyUuid, resource: true };
      return undefined;
    case "volume_id":
      return { theirs: [w.B.volume], nobody: nobodyUuid, resource: true };
    case "session_id":
      return { theirs: [B.session], nobody: "no-session", resource: true };
    case "endpoint_id":
      return { theirs: [B.webhookEndpoint], nobody: nobodyUuid, resource: true };
    case "command_id":
      return { theirs: [B.command], nobody: nobodyUuid, resource: true };
    // Not resources: values any caller may send.
    case "port":
      return plain("3000");
    // A signed preview URL's token: opens nothing of B's without B's sandbox in the same path.
    case "token":
      return plain("abcdefghijklmnop");
    case "is_public":
      return plain("true");
    case "interval":
    case "ttl_minutes":
      return plain("5");
    case "provider":
      return plain("github");
    case "provider_user_id":
      return plain("x");
    // A changeset's form (tar or diff).
    case "format":
      return plain("tar");
    default:
      return undefined;
  }
}

/** Parameters that are credentials rather than ids: whoever holds a sandbox's token may use it. */
export const CREDENTIAL_PARAMS = new Set(["auth_token"]);

export const paramsOf = (template: string): string[] => [...template.matchAll(/\{([a-z0-9_]+)/g)].map((m) => m[1]!);

/**
 * The ways to fill a route's parameters with B's ids, each with the same route filled with ids
 * that exist nowhere. `ownOrg`: the caller's own organization in `organization_id` and B's
 * ids in the rest (B's role through A's path, ...). Undefined when a parameter is not mapped.
 */
export function fillings(w: World, service: string, params: string[], ownOrg?: string): Array<{ theirs: Record<string, string>; nobody: Record<string, string> }> | undefined {
  const table = params.map((p) => [p, idsFor(w, service, p)] as const);
  if (table.some(([, ids]) => !ids)) return undefined;
  let combos: Array<{ theirs: Record<string, string>; nobody: Record<string, string> }> = [{ theirs: {}, nobody: {} }];
  for (const [p, ids] of table) {
    const own = ownOrg !== undefined && p === "organization_id";
    const values = own ? [ownOrg] : ids!.theirs;
    combos = combos.flatMap((c) => values.map((v) => ({ theirs: { ...c.theirs, [p]: v }, nobody: { ...c.nobody, [p]: own || ids!.own?.includes(v) ? v : ids!.nobody } })));
  }
  return combos;
}

/** Parameters of a route that name a resource (B's or nobody's), other than the organization. */
export const resourceParams = (w: World, service: string, params: string[]) => params.filter((p) => p !== "organization_id" && idsFor(w, service, p)?.resource);

export function fillTemplate(template: string, values: Record<string, string>): string {
  return template.replace(/\{([a-z0-9_]+)(=[^}]*)?\}/g, (_m, name: string) => encodeURIComponent(values[name]!));
}
