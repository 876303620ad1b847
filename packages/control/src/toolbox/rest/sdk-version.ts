import type { IncomingHttpHeaders } from "node:http";
import { clientBefore, clientVersion } from "../../gateway/rest-route.ts";

// How the reference toolbox shapes its answers by the client's SDK version (development versions
// count as the newest).

const SPLIT_OUTPUT_HEADER = "x-daytona-split-output";

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
  if (!clientVersion(headers).sent) {
    const split = String(headers[SPLIT_OUTPUT_HEADER] ?? "").toLowerCase() === "true";
    return { combined: !split, serverDemux: false, legacyExecute: true };
  }
  return { combined: clientBefore(headers, [0, 27, 0]), serverDemux: !clientBefore(headers, [0, 167, 0]), legacyExecute: clientBefore(headers, [0, 158, 0]) };
}

/**
 * SDKs before 0.27 delete with no `recursive` parameter: the reference daemon of their time
 * removed a directory with everything in it (os.RemoveAll). Later clients say `recursive=true`,
 * and a directory without it is refused. Clients that send no version are treated as current.
 */
export function deletesDirectories(headers: IncomingHttpHeaders): boolean {
  return clientBefore(headers, [0, 27, 0]);
}
