import type { DescService } from "@bufbuild/protobuf";
import { createClient, type Client, type Transport } from "@connectrpc/connect";
import { toSandbarError } from "./errors.ts";

async function* mapErrors<T>(stream: AsyncIterable<T>, signal?: AbortSignal): AsyncGenerator<T> {
  try {
    yield* stream;
  } catch (err) {
    throw toSandbarError(err, signal);
  }
}

type CallHeaders = Parameters<Transport["unary"]>[3];

/** The call's headers with `extra` set over them. */
function withHeaders(header: CallHeaders, extra: Record<string, string> | undefined): CallHeaders {
  if (!extra) return header;
  const h = new Headers(header);
  for (const [k, v] of Object.entries(extra)) h.set(k, v);
  return h;
}

/**
 * `transport` with calls that fail with SandbarError subclasses and carry `headers`. Wrapping
 * the transport (rather than each method of a client) keeps the generated client's own types.
 */
function sandbarTransport(transport: Transport, headers: Record<string, string> | undefined): Transport {
  return {
    async unary(method, signal, timeoutMs, header, input, contextValues) {
      try {
        return await transport.unary(method, signal, timeoutMs, withHeaders(header, headers), input, contextValues);
      } catch (err) {
        throw toSandbarError(err, signal);
      }
    },
    async stream(method, signal, timeoutMs, header, input, contextValues) {
      try {
        const res = await transport.stream(method, signal, timeoutMs, withHeaders(header, headers), input, contextValues);
        return { ...res, message: mapErrors(res.message, signal) };
      } catch (err) {
        throw toSandbarError(err, signal);
      }
    },
  };
}

/**
 * A generated client whose calls fail with SandbarError subclasses and carry `headers` (a
 * toolbox client's sandbox); request and response types stay the generated ones.
 */
export function sandbarClient<T extends DescService>(service: T, transport: Transport, headers?: Record<string, string>): Client<T> {
  return createClient(service, sandbarTransport(transport, headers));
}
