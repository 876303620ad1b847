import type { IncomingMessage } from "node:http";
import { ConnectError } from "@connectrpc/connect";
import { errors } from "@sandbar/protocol";
import { bodyChunks } from "./body-chunks.ts";
import { parseContentType, parseDisposition } from "./multipart-headers.ts";

/**
 * One part of a multipart/form-data body: a text field, or a file whose bytes stream. A file
 * part's chunks are slices of the body's reads (no copy); a part not read to its end when the
 * next one is asked for is skipped.
 */
export type FormPart =
  | { kind: "field"; name: string; value: string; truncated: boolean }
  | { kind: "file"; name: string; filename: string | undefined; chunks: AsyncIterable<Buffer> };

/** Longest text field kept (busboy's default, which this parser replaced): the rest is cut. */
const FIELD_BYTES = 1024 * 1024;
/** Longest header block of a part (node's and busboy's limit). */
const HEADER_BYTES = 16 * 1024;
const CRLF = Buffer.from("\r\n");
const HEADERS_END = Buffer.from("\r\n\r\n");

/**
 * The parts of a multipart/form-data request, in order, as they arrive (RFC 7578). Pulled, not
 * pushed: nothing is read from the request while the consumer is busy with a part, which is how
 * a slow consumer holds back the body. The boundary is searched for with Buffer#indexOf (native;
 * busboy's Boyer-Moore loop in JS was a sixth of control's CPU per uploaded byte).
 */
export async function* formParts(req: IncomingMessage): AsyncGenerator<FormPart> {
  const boundary = boundaryOf(req.headers["content-type"] ?? "");
  const body = new Body(bodyChunks(req));
  const delimiter = Buffer.from(`\r\n--${boundary}`);
  try {
    // The first delimiter may open the body: a CRLF before it makes every delimiter alike.
    body.unshift(CRLF);
    for await (const _ of new Section(body, delimiter)) void _; // the preamble
    for (;;) {
      // After a delimiter: "--" ends the form; else optional blanks, then the part's headers.
      const after = await body.peek(2);
      if (after.length >= 2 && after[0] === 0x2d && after[1] === 0x2d) break;
      await body.skipBlanks();
      const head = await collect(new Section(body, HEADERS_END), HEADER_BYTES);
      if (head.truncated || !head.bytes.subarray(0, 2).equals(CRLF)) throw malformed(new Error("Malformed part header"));
      const part = new Section(body, delimiter);
      const headers = parseHeaders(head.bytes.subarray(2).toString("latin1"));
      const disposition = headers.get("content-disposition");
      const disp = disposition === undefined ? undefined : parseDisposition(disposition);
      if (disp === undefined || disp.type !== "form-data") {
        for await (const _ of part) void _; // not a form field: skipped, as busboy did
        continue;
      }
      const name = disp.params?.name ?? "";
      const filename = disp.params?.["filename*"] || disp.params?.filename || undefined;
      const type = parseContentType(headers.get("content-type") ?? "");
      if (filename !== undefined || (type && `${type.type}/${type.subtype}` === "application/octet-stream")) {
        yield { kind: "file", name, filename, chunks: part.reader() };
        for await (const _ of part) void _; // what the consumer left
      } else {
        const value = await collect(part, FIELD_BYTES);
        yield { kind: "field", name, value: value.bytes.toString("utf8"), truncated: value.truncated };
      }
    }
  } catch (err) {
    throw malformed(err);
  } finally {
    // Done or stopped early (an error): the rest of the body (the epilogue) is read and dropped.
    body.close();
  }
}

function boundaryOf(contentType: string): string {
  const type = parseContentType(contentType);
  if (!type || type.type !== "multipart" || type.subtype !== "form-data") throw errors.invalidArgument(`Expected a multipart/form-data body: Unsupported content type: ${contentType}`);
  const boundary = type.params?.boundary;
  if (typeof boundary !== "string" || boundary === "") throw errors.invalidArgument("Expected a multipart/form-data body: Multipart: Boundary not found");
  return boundary;
}

/** A part's header block as name (lower case) → first value; folded lines unfolded. */
function parseHeaders(text: string): Map<string, string> {
  const headers = new Map<string, string>();
  let last: string | undefined;
  for (const line of text.split("\r\n")) {
    if (line === "") continue;
    if ((line[0] === " " || line[0] === "\t") && last !== undefined) {
      if (headers.has(last)) headers.set(last, `${headers.get(last)} ${line.trim()}`);
      continue;
    }
    const colon = line.indexOf(":");
    if (colon <= 0) throw new Error("Malformed part header");
    last = line.slice(0, colon).trim().toLowerCase();
    if (!headers.has(last)) headers.set(last, line.slice(colon + 1).trim());
    else last = undefined; // a repeated header's continuation belongs to the ignored copy
  }
  return headers;
}

/** The client's error: a body that is not multipart/form-data as the headers said, or broke off. */
function malformed(err: unknown): ConnectError {
  return err instanceof ConnectError ? err : errors.invalidArgument(`Malformed multipart/form-data body: ${(err as Error).message}`);
}

/** A section's bytes, up to `limit` (the rest is read and dropped). */
async function collect(section: AsyncIterable<Buffer>, limit: number): Promise<{ bytes: Buffer; truncated: boolean }> {
  const chunks: Buffer[] = [];
  let size = 0;
  let truncated = false;
  for await (const chunk of section) {
    const room = limit - size;
    if (chunk.length > room) truncated = true;
    if (room <= 0) continue;
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    chunks.push(kept);
    size += kept.length;
  }
  return { bytes: chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size), truncated };
}

/** The request body's reads, with bytes read ahead and put back. */
class Body {
  private held: Buffer[] = [];
  private readonly source: AsyncGenerator<Buffer>;
  constructor(source: AsyncGenerator<Buffer>) {
    this.source = source;
  }

  /** The next bytes of the body; undefined at its end. */
  async next(): Promise<Buffer | undefined> {
    const held = this.held.pop();
    if (held) return held;
    try {
      const r = await this.source.next();
      return r.done ? undefined : r.value;
    } catch (err) {
      throw malformed(err);
    }
  }

  unshift(bytes: Buffer): void {
    if (bytes.length > 0) this.held.push(bytes);
  }

  /** At least `n` bytes unless the body ends first, left unread. */
  async peek(n: number): Promise<Buffer> {
    let bytes: Buffer = Buffer.alloc(0);
    while (bytes.length < n) {
      const more = await this.next();
      if (!more) break;
      bytes = bytes.length === 0 ? more : Buffer.concat([bytes, more]);
    }
    this.unshift(bytes);
    return bytes;
  }

  /** Skips spaces and tabs (transport padding after a delimiter). */
  async skipBlanks(): Promise<void> {
    for (;;) {
      const bytes = await this.next();
      if (!bytes) return;
      let i = 0;
      while (i < bytes.length && (bytes[i] === 0x20 || bytes[i] === 0x09)) i++;
      if (i < bytes.length) return this.unshift(bytes.subarray(i));
    }
  }

  close(): void {
    void this.source.return(undefined);
  }
}

/**
 * The bytes of a body up to a delimiter, which is consumed (what follows it is put back). Cut
 * where the body's reads were, except a read ending in what may be the start of the delimiter:
 * that tail waits for the next read (joined to it: a copy, for about one read in 256).
 */
class Section implements AsyncIterable<Buffer> {
  private done = false;
  private tail: Buffer | undefined;
  private readonly body: Body;
  private readonly delimiter: Buffer;
  constructor(body: Body, delimiter: Buffer) {
    this.body = body;
    this.delimiter = delimiter;
  }

  async next(): Promise<Buffer | undefined> {
    const d = this.delimiter;
    while (!this.done) {
      const read = await this.body.next();
      if (!read) throw malformed(new Error("Unexpected end of form"));
      const buf = this.tail ? Buffer.concat([this.tail, read]) : read;
      this.tail = undefined;
      const at = buf.indexOf(d);
      if (at >= 0) {
        this.done = true;
        this.body.unshift(buf.subarray(at + d.length));
        if (at > 0) return buf.subarray(0, at);
        return undefined;
      }
      const keep = partialMatch(buf, d);
      if (keep > 0) this.tail = Buffer.from(buf.subarray(buf.length - keep));
      if (buf.length > keep) return buf.subarray(0, buf.length - keep);
    }
    return undefined;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Buffer> {
    for (let chunk = await this.next(); chunk; chunk = await this.next()) yield chunk;
  }

  /** The section for a consumer: stopping early leaves the rest to be skipped, not lost. */
  reader(): AsyncIterable<Buffer> {
    return { [Symbol.asyncIterator]: () => ({ next: async () => {
      const value = await this.next();
      return value ? { value, done: false } : { value: undefined, done: true };
    }, return: async () => ({ value: undefined, done: true }) }) };
  }
}

/** The length of the longest end of `buf` that begins `needle` (shorter than the needle). */
function partialMatch(buf: Buffer, needle: Buffer): number {
  const first = needle[0];
  for (let i = Math.max(0, buf.length - needle.length + 1); i < buf.length; i++) {
    if (buf[i] !== first) continue;
    if (buf.subarray(i).equals(needle.subarray(0, buf.length - i))) return buf.length - i;
  }
  return 0;
}
