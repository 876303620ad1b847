import {
  create,
  type DescEnum,
  type DescField,
  type DescMessage,
  fromJson,
  isMessage,
  type JsonValue,
  type Message,
  type MessageShape,
  ScalarType,
  toJson as protoToJson,
} from "@bufbuild/protobuf";
import { isReflectMessage, type ReflectMessage, reflect, reflectList, reflectMap } from "@bufbuild/protobuf/reflect";
import { FeatureSet_FieldPresence, ListValueSchema, StructSchema, timestampDate, timestampFromDate, TimestampSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { enumValueJson } from "@sandbar/protocol";

// JSON as the reference API writes it (not canonical proto3 JSON): camelCase names, enums
// in their lower-case spelling, 64-bit integers as numbers, ISO-8601 times, and null for
// unset optional fields. Decoding checks every type and says which field is wrong.

type Obj = Record<string, unknown>;

const TIMESTAMP = "google.protobuf.Timestamp";
const STRUCT_TYPES = new Set(["google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"]);

/**
 * How deep a REST request's JSON may nest (objects and arrays). The contract's own messages nest
 * a few levels; deeper JSON only made recursive walks (audit metadata) overflow their stacks.
 */
export const MAX_JSON_DEPTH = 64;

/**
 * Whether JSON text nests deeper than `limit`, read before it is parsed (a 10 MB body of
 * brackets parses into millions of arrays). Brackets inside strings do not count.
 */
export function textNestsDeeper(text: string, limit = MAX_JSON_DEPTH): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: the next character is escaped
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > limit) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/** Timestamps PostgreSQL and google.protobuf.Timestamp both hold: years 1 to 9999 (UTC). */
export const MIN_TIMESTAMP_SECONDS = -62135596800; // 0001-01-01T00:00:00Z
export const MAX_TIMESTAMP_SECONDS = 253402300799; // 9999-12-31T23:59:59Z

/**
 * `omitUnset`: leave unset optional fields out instead of writing null. The control API's DTOs
 * write null (as the reference's API does); the toolbox leaves them out (as its daemon does:
 * clients test a running command's `exitCode` against undefined).
 */
export interface JsonOptions {
  omitUnset?: boolean;
}

/** A message as JSON; its fields are read through protobuf-es's reflection. */
export function messageToJson(desc: DescMessage, msg: Message, opts: JsonOptions = {}): Obj {
  const r = reflect(desc, msg, false);
  const out: Obj = {};
  for (const field of r.fields) {
    if (field.oneof) {
      if (r.oneofCase(field.oneof) === field) out[field.jsonName] = valueToJson(field, fieldValue(r, field), opts);
      continue;
    }
    const value = valueToJson(field, fieldValue(r, field), opts);
    if (value !== null || !opts.omitUnset) out[field.jsonName] = value;
  }
  return out;
}

/** One field of a message as JSON (a route's `response_body`). */
export function fieldToJson(desc: DescMessage, msg: Message, field: DescField, opts: JsonOptions = {}): unknown {
  return valueToJson(field, fieldValue(reflect(desc, msg, false), field), opts);
}

/**
 * A field's value as valueToJson takes it: undefined when a field with presence is unset, messages
 * as messages (a Struct field's JSON object comes back as a Struct message), lists as arrays and
 * maps as objects.
 */
function fieldValue(r: ReflectMessage, field: DescField): unknown {
  switch (field.fieldKind) {
    case "scalar":
    case "enum":
      return field.presence === FeatureSet_FieldPresence.IMPLICIT || r.isSet(field) ? r.get(field) : undefined;
    case "message":
      return r.isSet(field) ? r.get(field).message : undefined;
    case "list":
      return Array.from(r.get(field), messageOf);
    case "map":
      return Object.fromEntries(Array.from(r.get(field), ([k, v]) => [String(k), messageOf(v)]));
  }
}

function messageOf(item: unknown): unknown {
  return isReflectMessage(item) ? item.message : item;
}

/** One field's value as JSON (used for `response_body` too). */
export function valueToJson(field: DescField, value: unknown, opts: JsonOptions = {}): unknown {
  switch (field.fieldKind) {
    case "scalar":
      return value === undefined ? null : scalarToJson(field.scalar, value);
    case "enum":
      return value === undefined ? null : enumToJson(field.enum, value);
    case "message":
      return value === undefined ? null : singularMessageToJson(field.message, value, opts);
    case "list": {
      const list = Array.isArray(value) ? value : [];
      if (field.listKind === "scalar") return list.map((v) => scalarToJson(field.scalar, v));
      if (field.listKind === "enum") return list.map((v) => enumToJson(field.enum, v));
      return list.map((v) => singularMessageToJson(field.message, v, opts));
    }
    case "map": {
      const out: Obj = {};
      for (const [k, v] of Object.entries(typeof value === "object" && value !== null ? value : {})) {
        out[k] = field.mapKind === "scalar" ? scalarToJson(field.scalar, v) : field.mapKind === "enum" ? enumToJson(field.enum, v) : singularMessageToJson(field.message, v, opts);
      }
      return out;
    }
  }
}

function singularMessageToJson(desc: DescMessage, value: unknown, opts: JsonOptions): unknown {
  if (desc.typeName === TIMESTAMP) return isMessage(value, TimestampSchema) ? timestampDate(value).toISOString() : null;
  if (STRUCT_TYPES.has(desc.typeName)) {
    // protobuf-es holds a Struct field as plain JSON already; a message (Value, ListValue) converts.
    return isMessage(value, desc) ? protoToJson(desc, value) : value;
  }
  return isMessage(value, desc) ? messageToJson(desc, value, opts) : null;
}

function scalarToJson(type: ScalarType, value: unknown): unknown {
  if (typeof value === "bigint") return Number(value);
  if (type === ScalarType.BYTES && value instanceof Uint8Array) return Buffer.from(value).toString("base64");
  return value;
}

function enumToJson(desc: DescEnum, value: unknown): string | null {
  const v = typeof value === "number" ? desc.value[value] : undefined;
  return v && v.number !== 0 ? enumValueJson(v) : v ? null : String(value);
}

// ---- decoding ----

/** Where a value came from: a JSON body keeps its types; a path or query string is text. */
export type Source = "json" | "text";

export class DecodeErrors {
  readonly messages: string[] = [];
  add(message: string): undefined {
    this.messages.push(message);
    return undefined;
  }
}

/** Decodes a JSON object into a message; unknown properties are ignored, as the reference does. */
export function messageFromJson<D extends DescMessage>(desc: D, json: unknown, errs: DecodeErrors, path = ""): MessageShape<D> {
  const msg = create(desc);
  if (json === null || json === undefined) return msg;
  if (!isObject(json)) {
    errs.add(`${path || "body"} must be an object`);
    return msg;
  }
  const r = reflect(desc, msg, false);
  for (const field of desc.fields) {
    const raw = field.jsonName in json ? json[field.jsonName] : json[field.name];
    if (raw === undefined || raw === null) continue;
    setReflected(r, field, raw, "json", errs, path);
  }
  return msg;
}

/**
 * Sets one field of `msg` from a JSON value or from text (path and query parameters). A record
 * is taken while the gateway's handler still holds its messages as records; it must be a
 * message of the field's type all the same.
 */
export function setField(msg: Message | Obj, field: DescField, raw: unknown, source: Source, errs: DecodeErrors, path = ""): void {
  if (!isMessage(msg, field.parent)) throw new Error(`setField: not a ${field.parent.typeName} message`);
  setReflected(reflect(field.parent, msg, false), field, raw, source, errs, path);
}

// Values are checked here, with the messages the API answers; reflect()'s own checks are off
// (they would also refuse strings with lone surrogates, which the API has always taken).
function setReflected(r: ReflectMessage, field: DescField, raw: unknown, source: Source, errs: DecodeErrors, path: string): void {
  const value = decodeField(field, raw, source, errs, path + field.jsonName);
  if (value !== undefined) r.set(field, value);
}

/** A field's value in the form ReflectMessage.set takes (messages reflected, lists and maps as ReflectList and ReflectMap), or undefined after an error. */
function decodeField(field: DescField, raw: unknown, source: Source, errs: DecodeErrors, name: string): unknown {
  switch (field.fieldKind) {
    case "scalar":
      return scalarFromJson(field.scalar, raw, source, errs, name);
    case "enum":
      return enumFromJson(field.enum, raw, errs, name, false);
    case "message":
      return singularMessageFromJson(field.message, raw, source, errs, name);
    case "list": {
      const items = source === "text" && !Array.isArray(raw) ? [raw] : raw;
      if (!Array.isArray(items)) return errs.add(`${name} must be an array`);
      const out = items.map((v) =>
        field.listKind === "scalar"
          ? scalarFromJson(field.scalar, v, source, errs, `each value in ${name}`)
          : field.listKind === "enum"
            ? enumFromJson(field.enum, v, errs, name, true)
            : singularMessageFromJson(field.message, v, source, errs, name),
      );
      if (out.includes(undefined)) return undefined;
      const list = reflectList(field, undefined, false);
      for (const item of out) list.add(item);
      return list;
    }
    case "map": {
      if (!isObject(raw)) return errs.add(`${name} must be an object`);
      const map = reflectMap(field, undefined, false);
      for (const [k, v] of Object.entries(raw)) {
        const item =
          field.mapKind === "scalar"
            ? scalarFromJson(field.scalar, v, "json", errs, `${name}.${k}`)
            : field.mapKind === "enum"
              ? enumFromJson(field.enum, v, errs, `${name}.${k}`, false)
              : singularMessageFromJson(field.message, v, "json", errs, `${name}.${k}`);
        if (item !== undefined) map.set(k, item);
      }
      return map;
    }
  }
}

function singularMessageFromJson(desc: DescMessage, raw: unknown, source: Source, errs: DecodeErrors, name: string): ReflectMessage | undefined {
  if (desc.typeName === TIMESTAMP) {
    const date = typeof raw === "string" && ISO_DATE.test(raw) ? new Date(raw) : undefined;
    const seconds = date ? Math.floor(date.getTime() / 1000) : NaN;
    // Year 0 parses (JavaScript's proleptic calendar) but no column or Timestamp takes it.
    if (!date || !(seconds >= MIN_TIMESTAMP_SECONDS && seconds <= MAX_TIMESTAMP_SECONDS)) return errs.add(`${name} must be a valid ISO 8601 date string`);
    return reflect(TimestampSchema, timestampFromDate(date), false);
  }
  // The JSON types take the body's JSON value (a Struct field then holds it as a plain object again).
  if (desc.typeName === StructSchema.typeName) {
    if (!isObject(raw) || !isJsonValue(raw)) return errs.add(`${name} must be an object`);
    return reflect(StructSchema, fromJson(StructSchema, raw), false);
  }
  if (desc.typeName === ListValueSchema.typeName) {
    if (!Array.isArray(raw) || !isJsonValue(raw)) return errs.add(`${name} must be an array`);
    return reflect(ListValueSchema, fromJson(ListValueSchema, raw), false);
  }
  if (desc.typeName === ValueSchema.typeName) return isJsonValue(raw) ? reflect(ValueSchema, fromJson(ValueSchema, raw), false) : errs.add(`${name} must be JSON`);
  if (source === "text") return errs.add(`${name} must be an object`);
  return reflect(desc, messageFromJson(desc, raw, errs, `${name}.`), false);
}

const ISO_DATE = /^\d{4}-\d{2}-\d{2}([Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2})?)?$/;
const INT_TYPES = new Set([ScalarType.INT32, ScalarType.SINT32, ScalarType.SFIXED32, ScalarType.UINT32, ScalarType.FIXED32]);
const LONG_TYPES = new Set([ScalarType.INT64, ScalarType.SINT64, ScalarType.SFIXED64, ScalarType.UINT64, ScalarType.FIXED64]);
const FLOAT_MAX = 3.4028234663852886e38;
const UNSIGNED = new Set([ScalarType.UINT32, ScalarType.FIXED32, ScalarType.UINT64, ScalarType.FIXED64]);

function scalarFromJson(type: ScalarType, raw: unknown, source: Source, errs: DecodeErrors, name: string): unknown {
  switch (type) {
    case ScalarType.STRING:
      return typeof raw === "string" ? raw : errs.add(`${name} must be a string`);
    case ScalarType.BOOL:
      if (typeof raw === "boolean") return raw;
      if (source === "text" && (raw === "true" || raw === "false")) return raw === "true";
      return errs.add(`${name} must be a boolean value`);
    case ScalarType.BYTES:
      return typeof raw === "string" && /^[A-Za-z0-9+/_-]*={0,2}$/.test(raw) ? new Uint8Array(Buffer.from(raw, "base64")) : errs.add(`${name} must be base64`);
    default: {
      const n = typeof raw === "number" ? raw : source === "text" && typeof raw === "string" && raw.trim() !== "" ? Number(raw) : NaN;
      if (!Number.isFinite(n)) return errs.add(`${name} must be a number`);
      const integral = INT_TYPES.has(type) || LONG_TYPES.has(type);
      if (integral && !Number.isInteger(n)) return errs.add(`${name} must be an integer number`);
      if (UNSIGNED.has(type) && n < 0) return errs.add(`${name} must not be less than 0`);
      if (INT_TYPES.has(type) && (UNSIGNED.has(type) ? n > 2 ** 32 - 1 : n > 2 ** 31 - 1 || n < -(2 ** 31))) return errs.add(`${name} is out of range`);
      if (LONG_TYPES.has(type)) return Number.isSafeInteger(n) ? BigInt(n) : errs.add(`${name} is out of range`);
      if (type === ScalarType.FLOAT && Math.abs(n) > FLOAT_MAX) return errs.add(`${name} is out of range`);
      return n;
    }
  }
}

function enumFromJson(desc: DescEnum, raw: unknown, errs: DecodeErrors, name: string, each: boolean): number | undefined {
  if (typeof raw === "string") {
    const hit = desc.values.find((v) => v.number !== 0 && enumValueJson(v) === raw);
    if (hit) return hit.number;
  }
  const allowed = desc.values.filter((v) => v.number !== 0).map(enumValueJson).join(", ");
  return errs.add(`${each ? "each value in " : ""}${name} must be one of the following values: ${allowed}`);
}

function isObject(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** What JSON.parse gives: true for every value of a request body (the JSON types take it as it is). */
function isJsonValue(v: unknown): v is JsonValue {
  switch (typeof v) {
    case "string":
    case "boolean":
      return true;
    case "number":
      return Number.isFinite(v);
    case "object":
      return v === null || (Array.isArray(v) ? v.every(isJsonValue) : Object.values(v).every(isJsonValue));
    default:
      return false;
  }
}
