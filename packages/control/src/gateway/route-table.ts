import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { httpBindingsOf, routeOf } from "@sandbar/protocol";

/** One REST route: a verb and path template bound to an RPC. */
export interface RestRoute {
  verb: string;
  template: string;
  service: DescService;
  method: DescMethod;
  /** Literal segments, or `{name}` parameters bound to the request field `name`. */
  segments: Array<{ literal: string } | { param: string }>;
  body: string;
  responseBody: string;
  status: number;
  /** Unset optional fields are left out of responses rather than written as null. */
  omitUnset: boolean;
}

export interface RouteMatch {
  route: RestRoute;
  params: Record<string, string>;
}

/**
 * The route table, read from the contract's google.api.http rules. Paths are matched
 * segment by segment; where two templates fit, literal segments win over parameters
 * (so /api-keys/current beats /api-keys/{name}).
 */
export class RouteTable {
  private readonly byVerb = new Map<string, RestRoute[]>();

  /** Each group's paths are mounted under its prefix (the toolbox mounts the agent's paths under a sandbox). */
  constructor(groups: Array<{ services: DescService[]; prefix?: string; omitUnset?: boolean }>) {
    for (const { services, prefix = "", omitUnset = false } of groups) {
      for (const service of services) {
        for (const method of service.methods) {
          for (const b of httpBindingsOf(method)) this.add(service, method, b.verb, prefix + b.path, b.body, b.responseBody, omitUnset);
        }
      }
    }
    for (const routes of this.byVerb.values()) routes.sort(bySpecificity);
  }

  private add(service: DescService, method: DescMethod, verb: string, template: string, body: string, responseBody: string, omitUnset: boolean) {
    const segments = split(template).map((s) => {
      const m = /^\{([a-z0-9_]+)(=[^}]*)?\}$/.exec(s);
      return m ? { param: m[1] } : { literal: s };
    });
    const status = routeOf(method).status || 200;
    const list = this.byVerb.get(verb) ?? [];
    list.push({ verb, template, service, method, segments, body, responseBody, status, omitUnset });
    this.byVerb.set(verb, list);
  }

  match(verb: string, path: string): RouteMatch | undefined {
    const parts = split(path);
    for (const route of this.byVerb.get(verb) ?? []) {
      if (route.segments.length !== parts.length) continue;
      const params: Record<string, string> = {};
      let ok = true;
      for (let i = 0; i < parts.length && ok; i++) {
        const seg = route.segments[i];
        if ("literal" in seg) ok = seg.literal === parts[i];
        else params[seg.param] = decodeURIComponent(parts[i]);
      }
      if (ok) return { route, params };
    }
    return undefined;
  }

  /** Whether any verb serves this path (to tell 404 from 405). */
  verbsFor(path: string): string[] {
    return [...this.byVerb.keys()].filter((v) => this.match(v, path));
  }

  get routes(): RestRoute[] {
    return [...this.byVerb.values()].flat();
  }
}

function split(path: string): string[] {
  return path.split("/").filter((s) => s !== "");
}

function bySpecificity(a: RestRoute, b: RestRoute): number {
  for (let i = 0; i < Math.min(a.segments.length, b.segments.length); i++) {
    const al = "literal" in a.segments[i];
    const bl = "literal" in b.segments[i];
    if (al !== bl) return al ? -1 : 1;
  }
  return 0;
}
