import type { DescService } from "@bufbuild/protobuf";
import { createClient, type CallOptions, type Client, type Transport } from "@connectrpc/connect";
import { toSandbarError } from "./errors.ts";

type AnyFn = (req: unknown, opts?: CallOptions) => unknown;

async function* mapErrors<T>(stream: AsyncIterable<T>, signal?: AbortSignal): AsyncGenerator<T> {
  try {
    yield* stream;
  } catch (err) {
    throw toSandbarError(err, signal);
  }
}

/**
 * A generated client whose calls fail with SandbarError subclasses and carry `headers` (a
 * toolbox client's sandbox); request and response types stay the generated ones.
 */
export function sandbarClient<T extends DescService>(service: T, transport: Transport, headers?: Record<string, string>): Client<T> {
  const raw = createClient(service, transport) as unknown as Record<string, AnyFn>;
  const withHeaders = (opts?: CallOptions): CallOptions | undefined => {
    if (!headers) return opts;
    const h = new Headers(opts?.headers);
    for (const [k, v] of Object.entries(headers)) h.set(k, v);
    return { ...opts, headers: h };
  };
  const out: Record<string, AnyFn> = {};
  for (const method of service.methods) {
    const fn = raw[method.localName];
    out[method.localName] =
      method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming"
        ? (req, opts) => mapErrors(fn(req, withHeaders(opts)) as AsyncIterable<unknown>, opts?.signal)
        : async (req, opts) => {
            try {
              return await fn(req, withHeaders(opts));
            } catch (err) {
              throw toSandbarError(err, opts?.signal);
            }
          };
  }
  return out as unknown as Client<T>;
}
