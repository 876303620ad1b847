import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { ResolvedConfig } from "./sdk.ts";

// TEMPORARY until the SDK exports its transport: the same wiring (bearer, organization header
// for a JWT, the sandbox header for toolbox calls), replaced by the SDK's at the next merge.
export function sdkTransport(config: ResolvedConfig, sandboxId?: string): Transport {
  const headers: Record<string, string> = {};
  const bearer = config.apiKey ?? config.jwtToken;
  if (bearer) headers.authorization = `Bearer ${bearer}`;
  if (config.jwtToken && !config.apiKey && config.organizationId) headers["x-sandbar-organization-id"] = config.organizationId;
  if (sandboxId) headers["x-sandbar-sandbox-id"] = sandboxId;
  const stamp: Interceptor = (next) => (req) => {
    for (const [k, v] of Object.entries(headers)) req.header.set(k, v);
    return next(req);
  };
  return createGrpcTransport({ baseUrl: config.grpcBaseUrl, interceptors: [stamp] });
}
