import type { DescService } from "@bufbuild/protobuf";
import { Code, type Client } from "@connectrpc/connect";
import { createSandbarTransport, sandbarClient, SANDBOX_HEADER, type ResolvedConfig } from "./sdk.ts";

/** A CLI waits out a short Retry-After on reads (saying so); a longer one fails at once with the wait named. */
const MAX_RETRY_AFTER_MS = 5_000;

/** The SDK's transport and typed clients, with retry notices for people. */
export function cliClients(config: ResolvedConfig, note: (line: string) => void, tokenProvider?: () => Promise<string>): <S extends DescService>(service: S, sandboxId?: string) => Client<S> {
  const { transport } = createSandbarTransport(config, {
    maxRetryAfterMs: MAX_RETRY_AFTER_MS,
    onRetry: (info) => note(`sandbar: ${info.method}: ${info.code === Code.ResourceExhausted ? "rate limited" : "server unavailable"}; retrying in ${Math.ceil(info.delayMs / 1000)} s`),
  }, tokenProvider);
  return (service, sandboxId) => sandbarClient(service, transport, sandboxId ? { [SANDBOX_HEADER]: sandboxId } : undefined);
}
