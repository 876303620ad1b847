import { isIPv4, isIPv6 } from "node:net";

/**
 * The PROXY protocol (haproxy's `send-proxy` v1 text and `send-proxy-v2` binary header): a load
 * balancer in TCP mode states the client's address in front of the bytes it relays. Parsed
 * incrementally from what has arrived so far; never more than the longest valid header is needed.
 */

/** The v2 header's fixed signature (12 bytes). */
export const V2_SIGNATURE = Buffer.from("0d0a0d0a000d0a515549540a", "hex");
const V1_PREFIX = Buffer.from("PROXY ", "latin1");
/** Longest v1 line, CRLF included (the spec's figure). */
const V1_MAX = 107;
/** Longest v2 header accepted: 16 fixed bytes plus addresses and TLVs (the spec's figure). */
export const V2_MAX = 536;

export interface ProxyHeader {
  version: 1 | 2;
  /** Bytes the header took: what follows is the relayed stream. */
  length: number;
  /**
   * The client as the proxy states it; absent for a v2 LOCAL (the proxy's own health check), v1
   * UNKNOWN, or an unspecified or unix address family: the connection's own peer counts then.
   */
  source?: { address: string; port: number };
}

export type ParseResult = { state: "incomplete" } | { state: "complete"; header: ProxyHeader } | { state: "invalid"; reason: string };

const INCOMPLETE: ParseResult = { state: "incomplete" };
const invalid = (reason: string): ParseResult => ({ state: "invalid", reason });

/** Whether `buf` so far agrees with `prefix` (the shorter's length compared). */
const agrees = (buf: Buffer, prefix: Buffer) => buf.subarray(0, prefix.length).equals(prefix.subarray(0, Math.min(buf.length, prefix.length)));

/** Reads a PROXY header at the start of `buf` (the bytes received so far). */
export function parseProxyHeader(buf: Buffer): ParseResult {
  if (buf.length === 0) return INCOMPLETE;
  if (agrees(buf, V2_SIGNATURE)) return parseV2(buf);
  if (agrees(buf, V1_PREFIX)) return parseV1(buf);
  return invalid("the connection does not start with a PROXY protocol header");
}

function parseV2(buf: Buffer): ParseResult {
  if (buf.length < 16) return INCOMPLETE;
  const versionCommand = buf[12]!;
  if (versionCommand >> 4 !== 2) return invalid(`PROXY v2: version ${versionCommand >> 4} (only 2 exists)`);
  const command = versionCommand & 0x0f;
  if (command > 1) return invalid(`PROXY v2: unknown command ${command}`);
  const family = buf[13]! >> 4;
  const transport = buf[13]! & 0x0f;
  const length = 16 + buf.readUInt16BE(14);
  if (length > V2_MAX) return invalid(`PROXY v2: a header of ${length} bytes (at most ${V2_MAX})`);
  if (family > 3 || transport > 2) return invalid(`PROXY v2: unknown address family/transport byte 0x${buf[13]!.toString(16).padStart(2, "0")}`);
  if (buf.length < length) return INCOMPLETE;
  const header = { version: 2 as const, length };
  // LOCAL: the proxy speaks for itself (its health checks); the addresses, if any, are ignored.
  if (command === 0 || family === 0 || family === 3) return { state: "complete", header };
  if (transport !== 1) return invalid("PROXY v2: a datagram transport on a stream connection");
  const size = family === 1 ? 4 : 16;
  if (length - 16 < 2 * size + 4) return invalid(`PROXY v2: an address block of ${length - 16} bytes for ${family === 1 ? "IPv4" : "IPv6"} (at least ${2 * size + 4})`);
  const raw = buf.subarray(16, 16 + size);
  const address = family === 1 ? [...raw].join(".") : ipv6(raw);
  return { state: "complete", header: { ...header, source: { address, port: buf.readUInt16BE(16 + 2 * size) } } };
}

function parseV1(buf: Buffer): ParseResult {
  const end = buf.indexOf("\r\n", 0, "latin1");
  const seen = end < 0 ? buf.length : end;
  for (let i = 0; i < Math.min(seen, V1_MAX); i++) {
    const c = buf[i]!;
    // A lone CR is allowed only as the last byte so far (its LF may be in the next packet).
    if ((c < 0x20 || c > 0x7e) && !(c === 0x0d && i === buf.length - 1)) return invalid("PROXY v1: a control or non-ASCII byte in the header line");
  }
  if (end < 0) return buf.length >= V1_MAX ? invalid(`PROXY v1: no CRLF within ${V1_MAX} bytes`) : INCOMPLETE;
  const length = end + 2;
  if (length > V1_MAX) return invalid(`PROXY v1: a header line of ${length} bytes (at most ${V1_MAX})`);
  const fields = buf.subarray(0, end).toString("latin1").split(" ");
  const header = { version: 1 as const, length };
  // UNKNOWN: the proxy could not tell (or speaks for itself); whatever follows is ignored.
  if (fields[1] === "UNKNOWN") return { state: "complete", header };
  if (fields[1] !== "TCP4" && fields[1] !== "TCP6") return invalid(`PROXY v1: unknown protocol "${fields[1] ?? ""}" (TCP4, TCP6 or UNKNOWN)`);
  if (fields.length !== 6) return invalid("PROXY v1: expected PROXY <TCP4|TCP6> <source> <destination> <source port> <destination port>");
  const [, proto, source, destination, sourcePort, destinationPort] = fields as [string, string, string, string, string, string];
  const valid = proto === "TCP4" ? isIPv4 : isIPv6;
  if (!valid(source) || !valid(destination)) return invalid(`PROXY v1: an address that is not ${proto === "TCP4" ? "IPv4" : "IPv6"}`);
  if (!isPort(sourcePort) || !isPort(destinationPort)) return invalid("PROXY v1: a port that is not a number 0-65535");
  const address = proto === "TCP4" ? source : canonicalIpv6(source);
  return { state: "complete", header: { ...header, source: { address, port: Number(sourcePort) } } };
}

const isPort = (s: string) => /^(0|[1-9]\d{0,4})$/.test(s) && Number(s) <= 65535;

/** One spelling per IPv6 address (rate-limit keys must not differ by notation); IPv4-mapped ones as IPv4. */
function ipv6(raw: Buffer): string {
  if (raw.subarray(0, 10).every((b) => b === 0) && raw[10] === 0xff && raw[11] === 0xff) return [...raw.subarray(12)].join(".");
  const groups = Array.from({ length: 8 }, (_, i) => raw.readUInt16BE(2 * i).toString(16));
  return new URL(`http://[${groups.join(":")}]/`).hostname.slice(1, -1);
}

function canonicalIpv6(text: string): string {
  const hostname = new URL(`http://[${text}]/`).hostname.slice(1, -1);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(hostname);
  if (!mapped) return hostname;
  const [hi, lo] = [parseInt(mapped[1]!, 16), parseInt(mapped[2]!, 16)];
  return [hi >> 8, hi & 0xff, lo >> 8, lo & 0xff].join(".");
}
