import { createRequire } from "node:module";

/**
 * busboy's parsers of a Content-Type and a Content-Disposition value (RFC 2045 parameters,
 * quoted strings, RFC 5987 `filename*`), so that parts are read as they were when busboy parsed
 * whole bodies; only its boundary search (a JS loop over every byte) is replaced
 * (multipart-parts.ts). A module of the pinned busboy 1.6 without typings of its own.
 */
interface Utils {
  parseContentType(value: string): { type: string; subtype: string; params: Record<string, string> | null } | undefined;
  parseDisposition(value: string, decoder: (value: string, hint: number) => string): { type: string; params: Record<string, string> | null } | undefined;
}

const utils = createRequire(import.meta.url)("busboy/lib/utils.js") as Utils;

/** Parameters without a charset of their own are kept as the header's bytes (latin1), as busboy does. */
const asIs = (value: string) => value;

export function parseContentType(value: string): ReturnType<Utils["parseContentType"]> {
  return utils.parseContentType(value);
}

export function parseDisposition(value: string): ReturnType<Utils["parseDisposition"]> {
  return utils.parseDisposition(value, asIs);
}
