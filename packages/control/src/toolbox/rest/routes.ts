import type { IncomingMessage, ServerResponse } from "node:http";
import { errors } from "@sandbar/protocol";
import type { ToolboxCaller } from "./call.ts";

/** What a toolbox REST handler gets: the request, its path parameters, and a caller for the agent's services. */
export interface RestContext {
  req: IncomingMessage;
  res: ServerResponse;
  sandboxId: string;
  params: Record<string, string>;
  query: URLSearchParams;
  caller: ToolboxCaller;
}

export type RestHandler = (ctx: RestContext) => Promise<void>;

/** A toolbox route served by a handler of its own rather than by the generic gateway. */
export interface SpecialRoute<H> {
  verb: string;
  /** Relative to the toolbox prefix, with `{name}` parameters. */
  path: string;
  handle: H;
}

type Segment = { literal: string } | { param: string };

/** Matches `{prefix}{route path}` for every toolbox prefix; the prefix carries `{sandbox_id}`. */
export class SpecialRoutes<H> {
  private readonly routes: Array<{ verb: string; segments: Segment[]; handle: H }> = [];

  constructor(prefixes: string[], routes: Array<SpecialRoute<H>>) {
    for (const prefix of prefixes) {
      for (const r of routes) this.routes.push({ verb: r.verb, segments: parse(prefix + r.path), handle: r.handle });
    }
  }

  match(verb: string, path: string): { handle: H; params: Record<string, string> } | undefined {
    const parts = path.split("/").filter((s) => s !== "");
    for (const route of this.routes) {
      if (route.verb !== verb || route.segments.length !== parts.length) continue;
      const params: Record<string, string> = {};
      let ok = true;
      for (let i = 0; i < parts.length && ok; i++) {
        const seg = route.segments[i];
        if ("literal" in seg) ok = seg.literal === parts[i];
        else params[seg.param] = decode(parts[i]);
      }
      if (ok) return { handle: route.handle, params };
    }
    return undefined;
  }
}

function parse(template: string): Segment[] {
  return template
    .split("/")
    .filter((s) => s !== "")
    .map((s) => {
      const m = /^\{([a-z0-9_]+)\}$/.exec(s);
      return m ? { param: m[1] } : { literal: s };
    });
}

function decode(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw errors.invalidArgument("Malformed URL encoding in path");
  }
}
