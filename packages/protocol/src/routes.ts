import { type DescEnumValue, type DescMethod, getOption, hasOption } from "@bufbuild/protobuf";
import { http } from "../gen/google/api/annotations_pb.js";
import type { HttpRule } from "../gen/google/api/http_pb.js";
import { Auth, json, RateLimit, route, type Route } from "../gen/sandbar/options/v1/options_pb.js";

export { Auth, RateLimit };
export type { HttpRule, Route };

const routeCache = new WeakMap<DescMethod, Route>();

/** The method's Route option (status, credentials, scope); defaults when absent. Cached: it is read on every call. */
export function routeOf(method: DescMethod): Route {
  let r = routeCache.get(method);
  if (!r) routeCache.set(method, (r = getOption(method, route)));
  return r;
}

/** The method's google.api.http rule, or undefined for RPC-only methods. */
export function httpRuleOf(method: DescMethod): HttpRule | undefined {
  return hasOption(method, http) ? getOption(method, http) : undefined;
}

/** An HTTP binding: verb and path template of a rule or of one of its additional bindings. */
export interface HttpBinding {
  verb: string;
  path: string;
  body: string;
  responseBody: string;
}

export function httpBindingsOf(method: DescMethod): HttpBinding[] {
  const rule = httpRuleOf(method);
  if (!rule) return [];
  return [rule, ...rule.additionalBindings].flatMap((r) => {
    const p = r.pattern;
    if (!p.case) return [];
    const [verb, path] = p.case === "custom" ? [p.value.kind.toUpperCase(), p.value.path] : [p.case.toUpperCase(), p.value];
    // Additional bindings inherit the primary rule's response_body when they do not set one.
    return [{ verb, path, body: r.body, responseBody: r.responseBody || rule.responseBody }];
  });
}

const enumJsonCache = new WeakMap<DescEnumValue, string>();

/** A value's JSON spelling: its `json` option, else the name without the enum prefix, lower-cased. */
export function enumValueJson(value: DescEnumValue): string {
  let name = enumJsonCache.get(value);
  if (name === undefined) {
    name = hasOption(value, json) ? getOption(value, json) : value.name.slice(value.parent.sharedPrefix?.length ?? 0).toLowerCase();
    enumJsonCache.set(value, name);
  }
  return name;
}
