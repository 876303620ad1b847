import { Code, ConnectError } from "@connectrpc/connect";

/** A failure the CLI explains itself: its message already says what to do next. */
export class CliError extends Error {
  readonly exitCode: number;
  constructor(message: string, exitCode = 1) {
    super(message);
    this.name = "CliError";
    this.exitCode = exitCode;
  }
}

/** Exit codes: 1 a failure, 2 a usage error; `exec` passes the command's own code through. */
export const EXIT = { failure: 1, usage: 2 } as const;

const NETWORK_CODES = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "ECONNRESET", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "UND_ERR_CONNECT_TIMEOUT"]);

function networkCode(err: unknown): string | undefined {
  for (let e: unknown = err, depth = 0; e && depth < 6; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && NETWORK_CODES.has(code)) return code;
    const errors = (e as { errors?: unknown }).errors;
    if (Array.isArray(errors)) for (const inner of errors) if (networkCode(inner)) return networkCode(inner);
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Seconds to wait from a 429's metadata (Retry-After), if it said. */
function retryAfter(err: unknown): number | undefined {
  const own = (err as { retryAfter?: unknown }).retryAfter;
  if (typeof own === "number" && Number.isFinite(own)) return own;
  for (let e: unknown = err, depth = 0; e && depth < 4; depth++) {
    if (e instanceof ConnectError) {
      const v = Number(e.metadata.get("retry-after"));
      if (Number.isFinite(v) && v > 0) return v;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** The API's error code in the Connect spelling ("not_found"), from an SDK error or a ConnectError. */
function codeOf(err: unknown): string | undefined {
  for (let e: unknown = err, depth = 0; e && depth < 4; depth++) {
    if (e instanceof ConnectError) return Code[e.code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && /^[a-z_]+$/.test(code)) return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * Any failure as one line saying what went wrong and what to do next (the stack trace only
 * with --debug). `server` names the API the command talked to.
 */
export function explain(err: unknown, server?: string): string {
  if (err instanceof CliError) return err.message;
  const where = server ? ` at ${server}` : "";
  const net = networkCode(err);
  if (net) return `Cannot reach the Sandbar server${where} (${net}): check that it is running, or point SANDBAR_API_URL (or \`sandbar login --api-url\`) at it.`;
  const raw = err instanceof ConnectError ? err.rawMessage : err instanceof Error ? err.message : String(err);
  // One line, whatever the server or a library wrote.
  const message = raw.replace(/\s*\n\s*/g, " ").replace(/[.\s]+$/, "");
  if (err instanceof Error && err.name === "ConfigurationError") return `${message}: run \`sandbar login\`, or set SANDBAR_API_KEY and SANDBAR_API_URL.`;
  switch (codeOf(err)) {
    case "unauthenticated":
      return `Not signed in, or your credentials expired or were revoked (${message}): run \`sandbar login\` (or \`sandbar login --api-key KEY\`).`;
    case "permission_denied":
      return `Permission denied: ${message}. Use an API key with that scope, or \`sandbar org use\` the right organization.`;
    case "resource_exhausted": {
      const wait = retryAfter(err);
      return `Rate limited by the server: ${message}. ${wait ? `Try again in ${wait} s.` : "Wait a moment and try again."}`;
    }
    case "not_found":
      return `Not found: ${message}.`;
    case "invalid_argument":
    case "out_of_range":
      return `Invalid request: ${message}.`;
    case "already_exists":
    case "failed_precondition":
    case "aborted":
      return `${message}.`;
    case "deadline_exceeded":
      return `Timed out: ${message}. Try again, or give the command more time.`;
    case "unavailable":
      return `The server${where} is unavailable: ${message}. Try again shortly; \`sandbar doctor\` on the server host says what it lacks.`;
    case "canceled":
      return "Cancelled.";
    default:
      return `${message}. Run again with --debug for details.`;
  }
}
