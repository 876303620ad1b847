import { getOption } from "@bufbuild/protobuf";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { Auth, route } from "@sandbar/protocol/gen/sandbar/options/v1/options_pb.js";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type { ResolvedConfig } from "./config.ts";
import { ConfigurationError } from "./errors.ts";
import { retryInterceptor, type RetryOptions } from "./retry.ts";
import { budgeted, SendBudget } from "./send-budget.ts";

/** Upload bytes the connection holds in node's stream queues at most (send-budget.ts). */
const UPLOAD_QUEUE_BYTES = 8 * 1024 * 1024;
/** maxSessionMemory of the connection, in MB: the upload queue and room for the rest (node refuses any HEADERS arriving past it). */
const SESSION_MEMORY_MB = 32;

/** Header naming the organization a JWT acts in (API keys belong to one already). */
export const ORGANIZATION_HEADER = "x-sandbar-organization-id";
/** Header naming the sandbox a toolbox call goes to. */
export const SANDBOX_HEADER = "x-sandbar-sandbox-id";

const NO_CREDENTIALS = "no credentials: set SANDBAR_API_KEY (or the apiKey option), or sign in and set SANDBAR_JWT_TOKEN with SANDBAR_ORGANIZATION_ID";

/** Answers the bearer token of each call: a CLI's signed-in person whose access token it refreshes. */
export type TokenProvider = () => string | Promise<string>;

/**
 * Bearer credential (API key or JWT) and, for a JWT, the organization header on every call. A
 * token provider, when given, is asked before each call (and each retry) and sends a JWT.
 */
export function credentialsInterceptor(config: Pick<ResolvedConfig, "apiKey" | "jwtToken" | "organizationId">, provider?: TokenProvider): Interceptor {
  const fixed = config.apiKey ?? config.jwtToken;
  const org = config.apiKey && !provider ? undefined : config.organizationId;
  return (next) => async (req) => {
    const token = provider ? await provider() : fixed;
    if (token) req.header.set("authorization", `Bearer ${token}`);
    // Public methods (GET /config) need none; the rest fail here with what to do rather than with a 401.
    else if (getOption(req.method, route).auth !== Auth.PUBLIC) throw new ConfigurationError(NO_CREDENTIALS);
    if (org) req.header.set(ORGANIZATION_HEADER, org);
    return next(req);
  };
}

export interface SandbarTransport {
  transport: Transport;
  /** Closes the HTTP/2 connection (idle connections do not keep the process alive anyway). */
  close(): void;
}

/** gRPC over HTTP/2 (h2c for http://, TLS with ALPN for https://) to the server's one port. */
export function createSandbarTransport(config: ResolvedConfig, retry?: RetryOptions, tokenProvider?: TokenProvider): SandbarTransport {
  const sessionManager = new Http2SessionManager(config.grpcBaseUrl, undefined, { maxSessionMemory: SESSION_MEMORY_MB });
  const grpc = createGrpcTransport({
    baseUrl: config.grpcBaseUrl,
    sessionManager,
    // The credentials sit inside the retries (interceptors run first to last), so each attempt asks for a fresh token.
    interceptors: [retryInterceptor(retry), credentialsInterceptor(config, tokenProvider)],
  });
  // Client streams (uploads) side by side share the connection's upload queue.
  const budget = new SendBudget(UPLOAD_QUEUE_BYTES);
  const transport: Transport = {
    unary: (method, signal, timeoutMs, header, message, contextValues) => grpc.unary(method, signal, timeoutMs, header, message, contextValues),
    stream: (method, signal, timeoutMs, header, input, contextValues) =>
      grpc.stream(method, signal, timeoutMs, header, method.methodKind === "client_streaming" ? budgeted(input, budget) : input, contextValues),
  };
  return { transport, close: () => sessionManager.abort() };
}
