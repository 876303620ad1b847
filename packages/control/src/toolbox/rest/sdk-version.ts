import type { IncomingHttpHeaders } from "node:http";

// The reference toolbox shapes session output by the client's SDK version (the
// X-Daytona-SDK-Version header, or on WebSocket upgrades a subprotocol entry
// "X-Daytona-SDK-Version~<version>"); development versions count as the newest.

export const SDK_VERSION_HEADER = "x-daytona-sdk-version";
export const SPLIT_OUTPUT_HEADER = "x-daytona-split-output";
export const SDK_VERSION_PROTOCOL = "X-Daytona-SDK-Version~";

type Version = [number, number, number];

/** How a client wants session output. */
export interface OutputMode {
  /** Markers stripped: plain combined text (SDKs before 0.27, clients that send no version). */
  combined: boolean;
  /** stdout/stderr split by the server and plain logs as JSON (SDK 0.167 on). */
  serverDemux: boolean;
  /** Commands come base64-wrapped in `sh -c "…"` (SDKs before 0.158, and clients that send no version). */
  legacyExecute: boolean;
}

export function outputMode(headers: IncomingHttpHeaders): OutputMode {
  const raw = sdkVersionOf(headers);
  const split = String(headers[SPLIT_OUTPUT_HEADER] ?? "").toLowerCase() === "true";
  if (raw === undefined) return { combined: !split, serverDemux: false, legacyExecute: true };
  const v = parseVersion(raw);
  // An unreadable version is treated like the newest (as development builds are).
  const before = (min: Version) => v !== undefined && compare(v, min) < 0;
  return { combined: before([0, 27, 0]), serverDemux: !before([0, 167, 0]), legacyExecute: before([0, 158, 0]) };
}

export function sdkVersionOf(headers: IncomingHttpHeaders): string | undefined {
  const header = headers[SDK_VERSION_HEADER];
  const value = Array.isArray(header) ? header[0] : header;
  if (value && value.trim() !== "") return value.trim();
  const offered = String(headers["sec-websocket-protocol"] ?? "").split(",").map((s) => s.trim());
  const entry = offered.find((p) => p.startsWith(SDK_VERSION_PROTOCOL));
  const version = entry?.slice(SDK_VERSION_PROTOCOL.length);
  return version ? version : undefined;
}

/** major.minor.patch of a semantic version; undefined for development builds and unreadable text. */
function parseVersion(text: string): Version | undefined {
  if (/dev/i.test(text)) return undefined;
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(text);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : undefined;
}

function compare(a: Version, b: Version): number {
  return a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
}

/**
 * SDKs before 0.27 delete with no `recursive` parameter: the reference daemon of their time
 * removed a directory with everything in it (os.RemoveAll). Later clients say `recursive=true`,
 * and a directory without it is refused. Clients that send no version are treated as current.
 */
export function deletesDirectories(headers: IncomingHttpHeaders): boolean {
  const raw = sdkVersionOf(headers);
  const v = raw === undefined ? undefined : parseVersion(raw);
  return v !== undefined && compare(v, [0, 27, 0]) < 0;
}
