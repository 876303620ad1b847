import type { IncomingHttpHeaders } from "node:http";

// The reference's clients say which SDK they are (the X-Daytona-SDK-Version header, or on
// WebSocket upgrades a subprotocol entry "X-Daytona-SDK-Version~<version>"), and answers are
// shaped by it. Read once per request.

const SDK_VERSION_HEADER = "x-daytona-sdk-version";
export const SDK_VERSION_PROTOCOL = "X-Daytona-SDK-Version~";

export type Version = [number, number, number];

/** A client's version: none sent, a release, or the newest (development builds and unreadable text). */
export type ClientVersion = { sent: false } | { sent: true; version?: Version };

const parsed = new WeakMap<IncomingHttpHeaders, ClientVersion>();

export function clientVersion(headers: IncomingHttpHeaders): ClientVersion {
  let v = parsed.get(headers);
  if (!v) parsed.set(headers, (v = parse(headers)));
  return v;
}

/** True only for a client that said it is a release older than `min`. */
export function clientBefore(headers: IncomingHttpHeaders, min: Version): boolean {
  const v = clientVersion(headers);
  return v.sent && v.version !== undefined && compare(v.version, min) < 0;
}

function parse(headers: IncomingHttpHeaders): ClientVersion {
  const header = headers[SDK_VERSION_HEADER];
  let raw = (Array.isArray(header) ? header[0] : header)?.trim();
  if (!raw) {
    const offered = String(headers["sec-websocket-protocol"] ?? "").split(",").map((s) => s.trim());
    raw = offered.find((p) => p.startsWith(SDK_VERSION_PROTOCOL))?.slice(SDK_VERSION_PROTOCOL.length);
  }
  if (!raw) return { sent: false };
  if (/dev/i.test(raw)) return { sent: true };
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(raw);
  return { sent: true, version: m ? [Number(m[1]), Number(m[2]), Number(m[3])] : undefined };
}

function compare(a: Version, b: Version): number {
  return a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
}
