import { type DescField, type DescMessage, type DescMethod, ScalarType } from "@bufbuild/protobuf";
import { errors, httpBindingsOf } from "@sandbar/protocol";
import { MAX_TIMESTAMP_SECONDS, MIN_TIMESTAMP_SECONDS } from "../gateway/json.ts";

/** Collects input problems and raises them together as one INVALID_ARGUMENT, like the reference. */
export class Checks {
  private readonly problems: string[] = [];

  displayName(field: string, value: string, max = 255): this {
    if (value.trim() === "") this.problems.push(`${field} should not be empty`);
    else if (value.length > max) this.problems.push(`${field} must be shorter than or equal to ${max} characters`);
    else if (!isSafeDisplayString(value)) this.problems.push(`${field} must not contain HTML tags, URLs, or control characters`);
    return this;
  }

  that(ok: boolean, problem: string): this {
    if (!ok) this.problems.push(problem);
    return this;
  }

  done(): void {
    if (this.problems.length) throw errors.invalidArgument([...new Set(this.problems)].join(", "));
  }
}

const URL_SCHEME = /(https?:\/\/|ftps?:\/\/|sftp:\/\/|ssh:\/\/|wss?:\/\/|file:\/\/|ldaps?:\/\/|javascript:|data:|mailto:|tel:|www\.)/i;

/** Names shown in dashboards and logs: no markup, no links, no control characters. */
function isSafeDisplayString(value: string): boolean {
  return !/<[^>]*>/.test(value) && !URL_SCHEME.test(value) && !/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(value);
}

// ---- every string of every request ----
//
// Ids and strings go to PostgreSQL (which refuses NUL), into btree indexes (a few KB per entry at
// most), into system calls (paths of PATH_MAX) and back out in error messages that travel as
// HTTP/2 headers between control and agent. So before any service sees a request, each string
// field is checked once: no NUL, and a length by what the field is.

/** Path-like fields: Linux's PATH_MAX. */
const MAX_PATH = 4096;
/** Credentials a client passes through (git passwords and tokens can be long JWTs). */
const MAX_SECRET = 8192;
/** Ids, names, refs and every other short string. */
const MAX_STRING = 1024;

const PATH_FIELDS = new Set(["path", "cwd", "source", "destination", "file", "files", "paths", "path_to_project", "dir", "uri", "mount_path", "subpath", "url"]);
const SECRET_FIELDS = new Set(["password", "username", "token", "value"]);
/** Free text whose size only the request body limit bounds (scripts, code, file text, patterns). */
const TEXT_FIELDS = new Set(["command", "code", "content", "new_value", "pattern", "message", "data", "dockerfile_content", "labels", "query", "result", "output"]);

export function maxLengthOf(fieldName: string): number {
  if (TEXT_FIELDS.has(fieldName)) return Infinity;
  if (PATH_FIELDS.has(fieldName)) return MAX_PATH;
  if (SECRET_FIELDS.has(fieldName)) return MAX_SECRET;
  return MAX_STRING;
}

const NUL = "\u0000";
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Text PostgreSQL and UTF-8 can hold: no lone surrogate (String#isWellFormed, before ES2024 typings). */
export function isWellFormed(s: string): boolean {
  return !LONE_SURROGATE.test(s);
}
const MAX_DEPTH = 16;

/** The problems of a decoded request message's strings, in class-validator's words. */
export function stringProblems(desc: DescMessage, message: unknown): string[] {
  const problems: string[] = [];
  walk(desc, message, "", problems, 0);
  return [...new Set(problems)];
}

function walk(desc: DescMessage, message: unknown, prefix: string, problems: string[], depth: number): void {
  if (typeof message !== "object" || message === null || depth > MAX_DEPTH) return;
  if (desc.typeName.startsWith("google.protobuf.")) return wellKnown(desc, message, prefix.slice(0, -1), problems);
  const m = message as Record<string, unknown>;
  for (const field of desc.fields) {
    let value = m[field.localName];
    if (field.oneof) {
      const o = m[field.oneof.localName] as { case?: string; value?: unknown } | undefined;
      value = o?.case === field.localName ? o.value : undefined;
    }
    if (value === undefined || value === null) continue;
    const name = prefix + field.jsonName;
    const max = maxLengthOf(field.name);
    const text = (v: unknown, label: string) => {
      if (typeof v !== "string") return;
      if (v.includes(NUL)) problems.push(`${label} must not contain NUL characters`);
      else if (!isWellFormed(v)) problems.push(`${label} must be valid Unicode text`);
      else if (v.length > max) problems.push(`${label} must be shorter than or equal to ${max} characters`);
    };
    switch (field.fieldKind) {
      case "scalar":
        if (field.scalar === ScalarType.STRING) text(value, name);
        break;
      case "list":
        for (const item of value as unknown[]) {
          if (field.listKind === "scalar" && field.scalar === ScalarType.STRING) text(item, `each value in ${name}`);
          else if (field.listKind === "message") walk(field.message, item, `${name}.`, problems, depth + 1);
        }
        break;
      case "map":
        for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
          if (k.includes(NUL) || !isWellFormed(k)) problems.push(`keys of ${name} must be Unicode text without NUL characters`);
          else if (k.length > MAX_STRING) problems.push(`keys of ${name} must be shorter than or equal to ${MAX_STRING} characters`);
          if (field.mapKind === "scalar" && typeof v === "string" && (v.includes(NUL) || !isWellFormed(v))) {
            problems.push(`${name}.${k.slice(0, 64)} must be Unicode text without NUL characters`);
          }
          else if (field.mapKind === "message") walk(field.message, v, `${name}.${k}.`, problems, depth + 1);
        }
        break;
      case "message":
        walk(field.message, value, `${name}.`, problems, depth + 1);
        break;
    }
  }
}

/**
 * Timestamps PostgreSQL can store: years 1 to 9999, Timestamp's own range, which a gRPC caller's
 * seconds can leave. (Struct depth needs no check here: protobuf-es decodes no message deeper
 * than 100 levels, the REST gateway no body deeper than MAX_JSON_DEPTH.)
 */
function wellKnown(desc: DescMessage, value: object, name: string, problems: string[]): void {
  if (desc.typeName !== "google.protobuf.Timestamp") return;
  const { seconds, nanos } = value as { seconds: bigint; nanos: number };
  if (!(seconds >= MIN_TIMESTAMP_SECONDS && seconds <= MAX_TIMESTAMP_SECONDS && nanos >= 0 && nanos <= 999_999_999)) problems.push(`${name} must be a valid ISO 8601 date string`);
}

const pathFieldsCache = new WeakMap<DescMethod, DescField[]>();

/** The fields every REST path of the method names (a catch-all `{x=**}` may be empty: not these). */
function pathFields(method: DescMethod): DescField[] {
  let fields = pathFieldsCache.get(method);
  if (!fields) {
    const named = httpBindingsOf(method).map((b) => new Set([...b.path.matchAll(/\{([a-z0-9_]+)\}/g)].map((m) => m[1])));
    fields = method.input.fields.filter((f) => named.length > 0 && named.every((n) => n.has(f.name)) && f.fieldKind === "scalar" && f.scalar === ScalarType.STRING);
    pathFieldsCache.set(method, fields);
  }
  return fields;
}

/**
 * Ids a REST path always carries are required over RPC too: an empty (or null) one is a 400, where
 * it reached PostgreSQL's uuid parser (500) or named nothing.
 */
export function requiredProblems(method: DescMethod, message: unknown): string[] {
  const m = message as Record<string, unknown>;
  return pathFields(method)
    .filter((f) => typeof m[f.localName] !== "string" || (m[f.localName] as string).trim() === "")
    .map((f) => `${f.jsonName} should not be empty`);
}

/** The problems of one text value bound to a field named `field` (path parameters, headers). */
export function textProblems(field: string, label: string, value: string): string[] {
  const max = maxLengthOf(field);
  if (value.includes(NUL)) return [`${label} must not contain NUL characters`];
  if (!isWellFormed(value)) return [`${label} must be valid Unicode text`];
  if (value.length > max) return [`${label} must be shorter than or equal to ${max} characters`];
  return [];
}
