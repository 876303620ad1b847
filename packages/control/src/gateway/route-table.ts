import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { errors, httpBindingsOf, routeOf } from "@sandbar/protocol";
import type { HandwrittenRoute, UpgradeRoute } from "./rest-route.ts";

/** `{name=**}` (last segment only) matches the rest of the path, zero or more segments. */
type Segment = { literal: string } | { param: string; rest?: true };

/** One REST route: a verb and path template bound to an RPC. */
export interface RestRoute {
  verb: string;
  template: string;
  service: DescService;
  method: DescMethod;
  /** Literal segments, or `{name}` parameters bound to the request field `name`. */
  segments: Segment[];
  body: string;
  responseBody: string;
  status: number;
  /** Unset optional fields are left out of responses rather than written as null. */
  omitUnset: boolean;
}

export type RouteMatch = { params: Record<string, string> } & (
  | { kind: "contract"; route: RestRoute }
  | { kind: "handwritten"; route: HandwrittenRoute }
  | { kind: "upgrade"; route: UpgradeRoute }
);

type Entry = { template: string; segments: Segment[]; handwritten: boolean; match: (params: Record<string, string>) => RouteMatch };

/** WebSocket routes live in the table under this verb. */
const UPGRADE = "UPGRADE";

/**
 * The gateway's one route table: the contract's google.api.http rules, and the routes written by
 * hand for wire formats the contract cannot describe (which win over a contract route of the same
 * path). Paths are matched segment by segment; where two templates fit, literal segments win over
 * parameters (so /api-keys/current beats /api-keys/{name}).
 */
export class RouteTable {
  private readonly byVerb = new Map<string, Entry[]>();
  private readonly contract: RestRoute[] = [];
  private readonly written: HandwrittenRoute[];

  /** Each group's paths are mounted under its prefix (the toolbox mounts the agent's paths under a sandbox). */
  constructor(
    groups: Array<{ services: DescService[]; prefix?: string; omitUnset?: boolean }>,
    extra: { handwritten?: HandwrittenRoute[]; upgrades?: UpgradeRoute[] } = {},
  ) {
    for (const { services, prefix = "", omitUnset = false } of groups) {
      for (const service of services) {
        for (const method of service.methods) {
          for (const b of httpBindingsOf(method)) {
            const template = prefix + b.path;
            const route: RestRoute = { verb: b.verb, template, service, method, segments: parse(template), body: b.body, responseBody: b.responseBody, status: routeOf(method).status || 200, omitUnset };
            this.contract.push(route);
            this.add(b.verb, template, false, (params) => ({ kind: "contract", route, params }));
          }
        }
      }
    }
    this.written = extra.handwritten ?? [];
    for (const route of this.written) this.add(route.verb, route.template, true, (params) => ({ kind: "handwritten", route, params }));
    for (const route of extra.upgrades ?? []) this.add(UPGRADE, route.template, true, (params) => ({ kind: "upgrade", route, params }));
    for (const entries of this.byVerb.values()) entries.sort(bySpecificity);
  }

  private add(verb: string, template: string, handwritten: boolean, match: Entry["match"]) {
    // A hand-written route replaces the contract's route of the same verb and template outright
    // (the sort below is not trusted to order two entries that fit the same paths).
    const list = (this.byVerb.get(verb) ?? []).filter((e) => !(handwritten && !e.handwritten && e.template === template));
    list.push({ template, segments: parse(template), handwritten, match });
    this.byVerb.set(verb, list);
  }

  /** The route serving a request; throws INVALID_ARGUMENT for a path that is not valid percent-encoding. */
  match(verb: string, path: string): RouteMatch | undefined {
    const parts = split(path);
    for (const entry of this.byVerb.get(verb) ?? []) {
      const last = entry.segments[entry.segments.length - 1];
      const rest = last !== undefined && "rest" in last;
      if (rest ? parts.length < entry.segments.length - 1 : entry.segments.length !== parts.length) continue;
      const params: Record<string, string> = {};
      let ok = true;
      for (let i = 0; i < entry.segments.length && ok; i++) {
        const seg = entry.segments[i]!;
        if ("literal" in seg) ok = seg.literal === parts[i];
        else if (seg.rest) params[seg.param] = parts.slice(i).join("/");
        else params[seg.param] = decode(parts[i]!);
      }
      if (ok) return entry.match(params);
    }
    return undefined;
  }

  /** The WebSocket route of a path, if any. */
  matchUpgrade(path: string): RouteMatch | undefined {
    return this.match(UPGRADE, path);
  }

  /** The routes read from the contract. */
  get routes(): RestRoute[] {
    return [...this.contract];
  }

  /** The routes written by hand. */
  get handwritten(): HandwrittenRoute[] {
    return [...this.written];
  }
}

function parse(template: string): Segment[] {
  return split(template).map((s) => {
    const m = /^\{([a-z0-9_]+)(=[^}]*)?\}$/.exec(s);
    if (m && m[2] === "=**") return { param: m[1]!, rest: true };
    return m ? { param: m[1]! } : { literal: s };
  });
}

function split(path: string): string[] {
  return path.split("/").filter((s) => s !== "");
}

function decode(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw errors.invalidArgument("Malformed URL encoding in path");
  }
}

function bySpecificity(a: Entry, b: Entry): number {
  for (let i = 0; i < Math.min(a.segments.length, b.segments.length); i++) {
    const al = "literal" in a.segments[i]!;
    const bl = "literal" in b.segments[i]!;
    if (al !== bl) return al ? -1 : 1;
  }
  // A catch-all tail matches what a fixed template of the same stem would: the fixed one first.
  const ar = a.segments.some((s) => "rest" in s);
  const br = b.segments.some((s) => "rest" in s);
  if (ar !== br) return ar ? 1 : -1;
  return Number(b.handwritten) - Number(a.handwritten);
}
