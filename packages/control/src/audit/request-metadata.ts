import { create, type DescMessage, isMessage } from "@bufbuild/protobuf";
import { MAX_JSON_DEPTH, messageToJson, valueToJson } from "../gateway/json.ts";

// What an audit entry keeps of a request: the request as the REST API spells it, without the
// fields the contract marks secret ([debug_redact = true]: passwords, key values, tokens,
// OpenTelemetry header values, environment variables), with long strings cut short and the
// whole bounded, so a file upload or a 10 MB body does not become a 10 MB row.

/** Strings longer than this are cut (with a note of their length). */
const MAX_STRING = 1024;
/** A request whose metadata would be larger than this keeps only its field names. */
const MAX_JSON = 64 * 1024;

const redactedCache = new WeakMap<DescMessage, boolean>();

/** Whether a message type holds a redacted field, at any depth (most do not: they skip the clone). */
function holdsSecrets(desc: DescMessage, seen = new Set<DescMessage>()): boolean {
  const known = redactedCache.get(desc);
  if (known !== undefined) return known;
  if (seen.has(desc)) return false;
  seen.add(desc);
  const result = desc.fields.some((f) => isRedacted(f) || (f.message !== undefined && holdsSecrets(f.message, seen)));
  redactedCache.set(desc, result);
  return result;
}

function isRedacted(field: DescMessage["fields"][number]): boolean {
  return field.proto.options?.debugRedact === true;
}

/** A message as the REST API spells it, without its redacted fields (at any depth). */
function withoutSecrets(desc: DescMessage, msg: Record<string, unknown>): Record<string, unknown> {
  if (!holdsSecrets(desc)) return messageToJson(desc, isMessage(msg, desc) ? msg : create(desc, msg));
  const out: Record<string, unknown> = {};
  for (const field of desc.fields) {
    if (isRedacted(field)) continue;
    let value = msg[field.localName];
    if (field.oneof) {
      const holder = msg[field.oneof.localName] as { case?: string; value?: unknown };
      if (holder.case !== field.localName) continue;
      value = holder.value;
    }
    const nested = field.message;
    if (!nested || !holdsSecrets(nested) || value === undefined) out[field.jsonName] = valueToJson(field, value);
    else if (field.fieldKind === "list") out[field.jsonName] = (value as Record<string, unknown>[]).map((v) => withoutSecrets(nested, v));
    else if (field.fieldKind === "map") {
      out[field.jsonName] = Object.fromEntries(Object.entries(value as Record<string, Record<string, unknown>>).map(([k, v]) => [k, withoutSecrets(nested, v)]));
    } else out[field.jsonName] = withoutSecrets(nested, value as Record<string, unknown>);
  }
  return out;
}

/** Text PostgreSQL stores: NUL and lone surrogates (which it refuses) become U+FFFD. */
export function storable(text: string): string {
  return text.replace(/\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "\ufffd");
}

/** The user information of a URL (`https://user:token@host/...`): a credential in any field. */
const URL_USERINFO = /\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#@]*@/gi;

/**
 * Cuts long strings, masks credentials written into URLs, removes what PostgreSQL's jsonb refuses.
 * Nesting past MAX_JSON_DEPTH is cut too: the entry is written before such a request is refused,
 * and an unbounded walk of it overflowed the stack.
 */
function tidy(value: unknown, depth = 0): unknown {
  if (typeof value === "string") {
    const clean = storable(value).replace(URL_USERINFO, "$1***@");
    return clean.length > MAX_STRING ? `${clean.slice(0, MAX_STRING)}... (${clean.length} characters)` : clean;
  }
  if (typeof value !== "object" || value === null) return value;
  if (depth >= MAX_JSON_DEPTH) return "... (nested too deep)";
  if (Array.isArray(value)) return value.map((v) => tidy(v, depth + 1));
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== null).map(([k, v]) => [tidy(k) as string, tidy(v, depth + 1)]));
}

/** The request as stored in an entry's metadata; undefined when there is none (client streams). */
export function requestMetadata(desc: DescMessage, message: unknown): Record<string, unknown> | undefined {
  if (typeof message !== "object" || message === null) return undefined;
  const json = tidy(withoutSecrets(desc, message as Record<string, unknown>)) as Record<string, unknown>;
  if (JSON.stringify(json).length <= MAX_JSON) return json;
  return { truncated: true, fields: Object.keys(json) };
}
